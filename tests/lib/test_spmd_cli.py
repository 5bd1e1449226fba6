"""The `monarch-spmd` command's dispatch and conventions: every command's --help, --version,
`python -m monarch_spmd`, the kubectl plugin's entry, short flags, and refusals of unknown input."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest

from monarch_spmd import cli

from .conftest import ROOT, cli_cmd, run


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


@pytest.mark.parametrize("command", ["run", "manifest", "worker", "logs", "status", "validate"])
def test_every_command_has_argparse_help_that_exits_0(command):
    result = run(cli_cmd(command, "--help"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"usage: monarch-spmd {command} ") and "options:" in result.stdout
    assert result.stderr == ""


def test_version_and_python_dash_m():
    from importlib import metadata

    expected = f"monarch-spmd {metadata.version('monarch-spmd')}\n"
    for argv in ([sys.executable, "-m", "monarch_spmd", "--version"], cli_cmd("-V")):
        result = run(argv)
        assert (result.returncode, result.stdout) == (0, expected), result.stderr
    as_module = run([sys.executable, "-m", "monarch_spmd", "--help"])
    assert as_module.returncode == 0 and as_module.stdout.startswith("usage: monarch-spmd {run,manifest,")


def test_the_worker_still_runs_a_script_called_with_help_after_its_argv(tmp_path):
    """Only `worker --help` (before any argv) is help: `worker -- train.py --help` is the script's."""
    result = run(cli_cmd("worker", "--", "-m", "x", "--help"), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 64 and "MONARCH_SPMD_MESH" in result.stderr


def test_the_kubectl_plugin_is_a_console_script_offering_status_logs_and_validate():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-spmd"] == "monarch_spmd.cli:kubectl_main"
    plugin = [sys.executable, "-c", "import sys; from monarch_spmd.cli import kubectl_main; sys.exit(kubectl_main())"]
    for command in cli.KUBECTL_COMMANDS:
        result = run([*plugin, command, "--help"])
        assert result.returncode == 0 and result.stdout.startswith(f"usage: monarch-spmd {command} "), result.stderr
    helped = run([*plugin, "--help"])
    assert helped.returncode == 0 and helped.stdout.startswith("usage: kubectl spmd {status,logs,validate}")
    refused = run([*plugin, "run", "--mesh", "procs=2", "--", "x.py"])
    assert refused.returncode == 2 and "kubectl spmd: unknown command 'run'" in refused.stderr


def test_short_flags_mean_one_thing_across_commands():
    """-n namespace, -A all namespaces, -f a file (or --follow where there is no file: logs, as
    kubectl logs), -o output, -w watch; -r is torchrun's --redirects (run) and nothing else."""
    def shorts(parser) -> dict[str, str]:
        return {s: a.dest for a in parser._actions for s in a.option_strings if re.fullmatch(r"-[A-Za-z]", s)}

    from monarch_spmd import logs, status, validate

    meaning = {"-n": "namespace", "-A": "all_namespaces", "-o": "output", "-w": "watch", "-R": "recursive",
               "-h": "help"}
    seen = {"logs": shorts(logs.build_parser()), "status": shorts(status.build_parser()),
            "validate": shorts(validate.build_parser()), "run": shorts(cli._run_parser()),
            "manifest": shorts(cli._manifest_parser())}
    for command, flags in seen.items():
        for flag, dest in flags.items():
            if flag in meaning:
                assert dest == meaning[flag], (command, flag, dest)
    assert seen["logs"]["-f"] == "follow" and seen["validate"]["-f"] == "files" and seen["run"]["-f"] == "manifest"
    assert seen["run"]["-r"] == "redirects" and "-r" not in seen["logs"]
    refused = run(cli_cmd("logs", "job", "-r", "0"))
    assert refused.returncode == 2 and "give --rank R" in refused.stderr
