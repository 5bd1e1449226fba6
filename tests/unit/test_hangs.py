"""A hang's capture around the rule (monarch_spmd.payload.hangs): the failure message it makes, a
stopped process seen as such, and real ranks' dumps taken with SIGABRT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from monarch_spmd.payload import hangs, procgroup, stacks

from .test_stacks import ALL_REDUCE, SLEEP


def _capture(ranks: list[int], fallback: int) -> hangs.Capture:
    procs = [SimpleNamespace(spec=SimpleNamespace(rank=r)) for r in ranks]
    named = {r: p for r, p in zip(ranks, procs)}
    return hangs.Capture("NoProgress", named[fallback], "went silent first",
                         lambda p: f"rank {p.spec.rank} wrote nothing for 10s (progress timeout 10s)",
                         procs, [], 0.0)  # type: ignore[arg-type]


def test_a_decided_message_leads_with_the_verdict_and_ends_with_the_culprits_frames():
    verdict = stacks.blame({0: stacks.parse(ALL_REDUCE), 1: stacks.parse(SLEEP), 2: stacks.parse(ALL_REDUCE)},
                           [0, 2, 1], 0, "went silent first")
    message = _capture([0, 1, 2], 0).message(verdict, detail=True)
    assert message == ("rank 1 is not in a collective (at stuck_rank.py:51 in main); ranks 0, 2 wait in all_reduce "
                       "(at stuck_rank.py:57 in main); rank 1 wrote nothing for 10s (progress timeout 10s); innermost "
                       "frames of rank 1: stuck_rank.py:51 in main < stuck_rank.py:66 in <module> < <frozen runpy>:88 "
                       "in _run_code < <frozen runpy>:198 in _run_module_as_main")
    assert len(message) < 600
    quiet = _capture([0, 1, 2], 0).message(stacks.blame(
        {0: stacks.parse(ALL_REDUCE), 1: stacks.parse(SLEEP), 2: stacks.parse(ALL_REDUCE)}, [0, 2, 1], 0,
        "went silent first", detail=False), detail=False)
    assert quiet == ("rank 1 is not in a collective; ranks 0, 2 wait in all_reduce; "
                     "rank 1 wrote nothing for 10s (progress timeout 10s)")


def test_undecided_the_detectors_words_come_first_and_alone_without_a_stack():
    verdict = stacks.blame({0: stacks.parse(SLEEP), 1: None}, [1, 0], 1, "went silent first")
    assert _capture([0, 1], 1).message(verdict, detail=True) == "rank 1 wrote nothing for 10s (progress timeout 10s)"
    verdict = stacks.blame({0: stacks.parse(SLEEP), 1: stacks.parse(SLEEP)}, [0, 1], 0, "went silent first")
    assert _capture([0, 1], 0).message(verdict, detail=True).startswith(
        "rank 0 wrote nothing for 10s (progress timeout 10s); no rule named a culprit (no rank is in a collective); "
        "rank 0 went silent first, the likely one; innermost frames of rank 0: stuck_rank.py:51 in main")


def test_a_stopped_process_is_seen_stopped():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not hangs.stopped(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not hangs.stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hangs.stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not hangs.stopped(proc.pid)


def test_real_ranks_dump_their_stacks_on_sigabrt_and_the_rule_reads_them():
    """Two Python processes started as the agent starts ranks (``-X faulthandler``): one in a
    sleep, one in a busy loop; the capture takes both dumps and leaves their tails as they were."""
    code = ("import sys, time\nprint('ready', flush=True)\n"
            "if sys.argv[1] == 'sleep':\n    time.sleep(600)\nwhile True:\n    pass\n")
    command = stacks.with_faulthandler([sys.executable, "-c", code])
    members = [procgroup.ProcSpec(rank=r, command=[*command, kind], env=dict(os.environ))
               for r, kind in enumerate(("sleep", "spin"))]
    out: list[bytes] = []
    group = hangs.CapturingGroup(members, lambda _which, data: out.append(data), grace=5.0)
    group.start()
    try:
        deadline = time.monotonic() + 60
        while sum(p.last_line == "ready" for p in group.procs) < 2 and time.monotonic() < deadline:
            group.step(0.1)
        capture = hangs.Capture.start(group, group.procs[0], "NoProgress", "went silent first",
                                      lambda p: f"rank {p.spec.rank} is silent")
        assert [p.spec.rank for p in capture.aborted] == [0, 1]
        deadline = time.monotonic() + 60
        while not capture.done() and time.monotonic() < deadline:
            group.step(0.1)
        verdict = capture.finish(group, detail=True)
        assert [p.returncode for p in group.procs] == [-signal.SIGABRT, -signal.SIGABRT]
        assert [(s.state, s.site.file, s.site.function) for s in (verdict.states[0], verdict.states[1])] == [
            (stacks.BUSY, "<string>", "<module>")] * 2
        assert (verdict.rank, verdict.decided) == (0, False)
        assert [p.last_line for p in group.procs] == ["ready", "ready"], "the tails are the ranks' own lines"
        assert b"[rank 1] Fatal Python error: Aborted" in b"".join(out)
    finally:
        group.finish()
