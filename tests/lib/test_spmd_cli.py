"""The `monarch-spmd` command's dispatch: run, worker and logs, and refusals of unknown input."""

from __future__ import annotations

from .conftest import cli_cmd, run


def test_usage_lists_the_subcommands():
    result = run(cli_cmd("--help"))
    assert result.returncode == 0
    for word in ("run", "worker", "logs"):
        assert f"  {word} " in result.stdout


def test_no_command_is_a_usage_error():
    result = run(cli_cmd())
    assert result.returncode == 2 and "usage: monarch-spmd" in result.stderr


def test_an_unknown_command_is_refused_by_name():
    result = run(cli_cmd("launch"))
    assert result.returncode == 2 and "unknown command 'launch'" in result.stderr


def test_logs_is_dispatched_to_the_logs_module():
    result = run(cli_cmd("logs", "--help"))
    assert result.returncode == 0, result.stderr
    assert "usage: monarch-spmd logs" in result.stdout


def test_the_worker_refuses_to_start_without_its_inputs():
    result = run(cli_cmd("worker", "--", "-m", "x"), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 64 and "MONARCH_SPMD_MESH" in result.stderr
