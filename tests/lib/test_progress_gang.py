"""The progress timeout judges the gang, not each rank: most training scripts print on rank 0
only, and a rank that says nothing while its collectives complete is not hung. A hang is the
gang writing nothing for the timeout; the rank it names is then found as before (the culprit
rules: the rank not waiting in a collective). Real runs of ``monarch-spmd run`` with gloo and a
script written as for torchrun (tests/programs/rank0_logger.py)."""

from __future__ import annotations

import re

import pytest

from .conftest import cli_cmd, run

PROGRAM = "tests.programs.rank0_logger"
#: --progress-timeout: short, and still above the silence of importing torch on a loaded 2-core
#: machine (a gang that writes nothing yet is judged from its start, so that one that hangs
#: before its first line is found too). The healthy runs last over twice as long.
TIMEOUT = "12"


@pytest.mark.parametrize("layout", [["--nnodes", "3", "--nproc-per-node", "1"], ["--nproc-per-node", "3"]],
                         ids=["three-workers", "one-worker"])
def test_a_healthy_gang_that_logs_on_rank_0_only_runs_clean_with_a_short_progress_timeout(layout):
    # 120 steps of 0.25 s: 30 s, in which ranks 1 and 2 write nothing at all. With three workers
    # their agents see none of rank 0's lines themselves: the coordinator's heartbeats say them.
    result = run(cli_cmd("run", *layout, "--progress-timeout", TIMEOUT, "-m", PROGRAM, "--steps", "120",
                         "--step-seconds", "0.25"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done after 120 steps" in result.stdout
    assert "NoProgress" not in result.stderr and "hangs" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == "[monarch-spmd] all 3 ranks succeeded"


def test_a_rank_stuck_outside_its_collective_still_fails_the_gang_and_is_named():
    # Rank 2 sleeps before step 5; ranks 0 and 1 wait in its all_reduce: the gang goes silent,
    # and the rank not waiting is the one named.
    result = run(cli_cmd("run", "--nnodes", "3", "--nproc-per-node", "1", "--progress-timeout", TIMEOUT,
                         "-m", PROGRAM, "--steps", "60", "--step-seconds", "0.25", "--hang-rank", "2",
                         "--hang-step", "5"), timeout=240)
    assert result.returncode != 0, result.stderr[-3000:]
    last = result.stderr.splitlines()[-1]
    assert re.match(r"\[monarch-spmd\] job failed: rank 2 .*(NoProgress|hangs)", last), result.stderr[-3000:]
    assert "step 4 loss" in result.stdout and "step 5 loss" not in result.stdout
