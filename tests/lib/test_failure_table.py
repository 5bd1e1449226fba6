"""A gang that fails at once still ends with the truth: every rank's exit code in the table and
the root cause on the last line, run after run. A missing script, an import error and
``sys.exit(3)`` at the first line fail before the runner's observer could connect, were it not
waited for (docs/library.md, "The local runner"); each case runs 20 times. The scripts import
nothing heavy, so a run takes a fraction of a second; the real runner, real workers and ranks."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from monarch_spmd import cli, runner
from monarch_spmd.payload import agent

RUNS = 20
_STOPPED = "-15 (SIGTERM)"


def _case(tmp_path: Path, kind: str) -> tuple[str, int]:
    """The script of a fast-failure case and the exit code its ranks end with."""
    if kind == "missing":
        return str(tmp_path / "missing.py"), 2
    script = tmp_path / f"{kind}.py"
    if kind == "import_error":
        script.write_text("import monarch_spmd_no_such_module  # noqa: F401\n")
        return str(script), 1
    script.write_text("import sys\nsys.exit(3)\n")
    return str(script), 3


def table_problems(stderr: str, code: int, world: int = 2) -> list[str]:
    """What is wrong with a failed run's last lines: the table must give every rank its process
    and exit code (the first failure's ``code``; the others ``code`` too, or SIGTERM's when their agent
    stopped them),
    and the last line must name the rank that failed first."""
    lines = stderr.splitlines()
    problems = []
    if any("lost (its worker is gone)" in line for line in lines):
        problems.append("a rank is said lost")
    head = "[monarch-spmd] restart 0, every rank's last process:"
    if head not in lines:
        return problems + ["no table"]
    rows = lines[lines.index(head) + 2:-1]
    first = re.fullmatch(rf"\[monarch-spmd\] job failed: rank (\d+) exited with code {code} "
                         r"\(no restarts allowed: maxRestarts 0\)", lines[-1])
    if first is None:
        problems.append(f"last line {lines[-1]!r}")
    seen = {}
    for row in rows:
        m = re.fullmatch(r"\[monarch-spmd\] +(\d+) +(\d+) +pid \d+ +(-?\d+(?: \(\w+\))?) +(.+)", row)
        if m is None:
            problems.append(f"row {row!r}")
            continue
        rank, exit_code, mark = int(m.group(1)), m.group(3), m.group(4)
        seen[rank] = (exit_code, mark)
    if sorted(seen) != list(range(world)):
        problems.append(f"ranks {sorted(seen)} in the table")
    root = int(first.group(1)) if first else None
    for rank, (exit_code, mark) in seen.items():
        if rank == root:
            ok = (exit_code, mark) == (str(code), "first failure")
        else:
            # Failed on its own, or stopped by its agent: by SIGTERM, or exiting first with its own code.
            ok = (exit_code, mark) in ((str(code), "failed too"), (_STOPPED, "stopped (after the first failure)"),
                                       (str(code), "stopped (after the first failure)"))
        if not ok:
            problems.append(f"rank {rank}: {exit_code} {mark}")
    return problems


def run_once(script: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["run", "--nproc-per-node", "2", "--max-restarts", "0", script])
    return code, err.getvalue()


@pytest.mark.parametrize("kind", ["missing", "import_error", "exit_3"])
def test_a_gang_that_fails_at_once_gets_every_ranks_exit_code_every_time(kind, tmp_path):
    script, code = _case(tmp_path, kind)
    wrong = []
    for i in range(RUNS):
        returncode, stderr = run_once(script)
        problems = table_problems(stderr, code)
        if returncode != code:
            problems.append(f"exit code {returncode}")
        if problems:
            wrong.append(f"run {i}: {'; '.join(problems)}\n{stderr}")
    assert not wrong, f"{len(wrong)} of {RUNS} runs wrong; the first:\n{wrong[0]}"


def test_the_runner_asks_rank_0s_worker_to_wait_for_its_observer():
    env = runner._worker_spec(runner._Plan(
        job=runner.job_from_args("hosts=2", ["x.py"]), env={}, run_id="r", python="python3",
        master_addr="127.0.0.1", master_port=29500, agent_port=29400, grace=1.0, progress_timeout=0.0,
        backoff=None, member_failure_limit=None, logs=None, gpus=False), 0, 0).env
    assert agent.observer_wait(env) == runner.OBSERVER_WAIT > 0
    for value, seconds in (("", 0.0), ("2.5", 2.5), ("x", 0.0), ("-1", 0.0), ("61", 0.0)):
        assert agent.observer_wait({agent.OBSERVER_WAIT_VAR: value}) == seconds
    assert agent.observer_wait({}) == 0.0  # pods and other callers: no wait
