"""When the operator's process starts afresh to give memory back (spmd_operator.memory), and
that starting afresh is a real exec of the same command line in the same process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spmd_operator import memory

MIB = memory.MIB
REPO = Path(__file__).resolve().parents[2]


def policy(start_mib=50, factor=2.0, min_mib=64, peak=1000):
    p = memory.RecyclePolicy(factor, min_mib * MIB, start=start_mib * MIB)
    p.jobs_seen(peak)
    return p


def test_a_burst_of_jobs_gone_with_its_memory_kept_asks_for_a_new_process():
    why = policy().verdict(151 * MIB, 0, collecting=False)
    assert why is not None
    assert "151 MiB" in why and "3.02x" in why and "50 MiB" in why and "0 of the 1000 jobs" in why


@pytest.mark.parametrize("resident_mib, jobs, collecting, reason", [
    (151, 251, False, "more than a quarter of the peak's jobs remain: the memory is still theirs"),
    (151, 250, True, "the deleted jobs' children are still being deleted: finish first"),
    (99, 0, False, "under twice the start"),
    (113, 0, False, "twice the start but under 64 MiB above it"),
    (None, 0, False, "resident memory unknown (no /proc)"),
])
def test_no_new_process_while_the_memory_may_still_be_needed(resident_mib, jobs, collecting, reason):
    p = policy(start_mib=50 if resident_mib != 113 else 56)
    resident = None if resident_mib is None else resident_mib * MIB
    assert p.verdict(resident, jobs, collecting) is None, reason


def test_a_quarter_of_the_peak_left_is_enough_and_the_peak_is_the_most_held_at_once():
    p = policy(peak=0)
    for held in (10, 400, 1000, 3):
        p.jobs_seen(held)
    assert p.peak_jobs == 1000
    assert p.verdict(200 * MIB, 250, collecting=False) is not None


def test_no_new_process_without_jobs_that_went():
    p = policy(peak=0)
    assert p.verdict(500 * MIB, 0, collecting=False) is None, "no job ever held: the memory is not theirs"
    p.jobs_seen(4)
    assert p.verdict(500 * MIB, 4, collecting=False) is None, "none went"
    assert p.verdict(500 * MIB, 1, collecting=False) is not None


def test_factor_zero_turns_it_off_and_negative_settings_are_refused():
    assert policy(factor=0).verdict(10_000 * MIB, 0, collecting=False) is None
    with pytest.raises(ValueError, match="factor"):
        memory.RecyclePolicy(-1.0)
    with pytest.raises(ValueError, match="min_excess"):
        memory.RecyclePolicy(2.0, -1)


def test_no_least_excess_and_a_factor_under_one_leave_the_jobs_share_to_decide():
    # A trim can take the process under the memory it had at its start: with no least excess and
    # a factor under 1, only the jobs that went (and the children still to go) decide.
    p = policy(start_mib=66, factor=0.01, min_mib=0, peak=8)
    assert p.verdict(60 * MIB, 1, collecting=False) is not None, "under the start, yet 7 of 8 jobs went"
    assert p.verdict(60 * MIB, 1, collecting=True) is None, "their children still go"
    assert p.verdict(60 * MIB, 3, collecting=False) is None, "3 of 8 is more than a quarter"
    assert policy(start_mib=66, factor=1.0, min_mib=0, peak=8).verdict(60 * MIB, 1, collecting=False) is None, \
        "a factor of 1 still asks for the start's memory at least"


def test_resident_bytes_reads_this_process():
    before = memory.resident_bytes()
    assert before is not None and before > 10 * MIB
    block = bytearray(64 * MIB)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert memory.resident_bytes() >= before + 60 * MIB
    del block


def test_recycle_runs_the_same_command_line_again_in_the_same_process():
    code = ("import os, sys; from spmd_operator import memory; n = memory.recycles(); "
            "print(os.getpid(), n, ' '.join(sys.argv[1:]), flush=True); n < 2 and memory.recycle()")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])}
    env.pop(memory.RECYCLES_ENV, None)
    out = subprocess.run([sys.executable, "-c", code, "--namespace", "a b"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert len(out) == 3, out
    pids = {line.split()[0] for line in out}
    assert len(pids) == 1, f"one process throughout: {out}"
    assert [line.split(maxsplit=2)[1:] for line in out] == [["0", "--namespace a b"], ["1", "--namespace a b"],
                                                            ["2", "--namespace a b"]]


def test_a_failed_start_afresh_ends_the_process_instead_of_leading_with_its_loops_stopped():
    """The interpreter gone (an upgrade of the image's Python under a running process, a full
    disk): the exec fails and the process exits, so its Lease lapses and another replica leads."""
    code = ("import logging, sys; logging.basicConfig(); from spmd_operator import memory; "
            "sys.executable = '/nonexistent/python3'; memory.recycle(); print('still here', flush=True)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == memory.EXEC_FAILED_EXIT, (done.returncode, done.stderr)
    assert "still here" not in done.stdout
    assert "could not start afresh" in done.stderr and "/nonexistent/python3" in done.stderr


@pytest.mark.parametrize("value, expected", [("", 0), ("3", 3), ("x", 0), ("-2", 0)])
def test_recycles_counts_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(memory.RECYCLES_ENV, value)
    assert memory.recycles() == expected

