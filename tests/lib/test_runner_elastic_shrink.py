"""`monarch-spmd run --nnodes MIN:MAX` handles a lost worker as the operator handles a lost pod of
an elastic job: the loss is a disruption (never counted against --max-restarts), the next round
starts without the worker after the elastic wait, and the runner starts the worker again (the
operator's new pod), so that the gang grows back when it joins (a membership change, not
counted either). The program's own failures still count. The real runner as a subprocess, real
workers and gloo, training written as for torchrun (tests/programs/elastic_steps.py); a worker
is lost by SIGKILL to its process, as a pod is lost with its node."""

from __future__ import annotations

import os
import re
import signal

from .conftest import cli_cmd, run

PROGRAM = "tests.programs.elastic_steps"
WAIT = 2  # --elastic-wait: seconds a round with at least MIN workers waits for the others


def start(spawn, tmp_path, *flags: str):
    """Two nodes of one proc, at least one: an elastic run that trains until ``stop`` exists."""
    return spawn(cli_cmd("run", "--nnodes", "1:2", "--nproc-per-node", "1", "--elastic-wait", str(WAIT),
                         "--grace-period", "3", *flags, "-m", PROGRAM, "--stop-file", str(tmp_path / "stop"),
                         "--step-seconds", "0.1"))


def worker_pids(text: str, first_rank: int) -> list[int]:
    """The pids of the workers started for the node whose first rank is ``first_rank``, in order."""
    return [int(p) for p in re.findall(rf"monarch-spmd worker: ranks {first_rank}\.\.\d+/\d+ .*? pid (\d+)", text)]


def notes(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[monarch-spmd] ")]


def lose_worker_1_and_wait_until_it_is_back(proc) -> int:
    """Trains at full size, SIGKILLs worker 1 and waits until the gang trains alone, then at full
    size again; returns the killed worker's pid."""
    proc.wait_for(r"elastic_steps rank 1 world 2 restart 0 step 2\b")  # both train at full size
    killed = worker_pids(proc.text, 1)[0]
    os.kill(killed, signal.SIGKILL)  # its node is lost: the worker and (its parent-death signal) its rank
    proc.wait_for(r"\[monarch-spmd\] restart 1 runs 1 of 2 workers")  # after the elastic wait
    proc.wait_for(r"\[monarch-spmd\] restart 2 runs 2 of 2 workers")  # worker 1 is back: the gang grew
    proc.wait_for(r"elastic_steps rank [01] world 2 restart 2 step 1\b", count=2)  # and trains at full size
    return killed


def test_a_lost_worker_shrinks_the_run_uncounted_and_is_started_again_so_the_gang_grows_back(spawn, tmp_path):
    proc = start(spawn, tmp_path)  # --max-restarts 0: torchrun's default
    killed = lose_worker_1_and_wait_until_it_is_back(proc)
    (tmp_path / "stop").touch()
    assert proc.finish(120) == 0, proc.text
    out = proc.text
    said = notes(out)
    lost = next(i for i, line in enumerate(said)
                if f"the worker of rank 1 (pid {killed}) was killed by SIGKILL" in line)
    assert ("was killed by SIGKILL (exit code 137): worker 1 is lost in restart 0, a disruption not counted against "
            "maxRestarts; the gang goes on without it (elastic, at least 1 of 2 workers) after the elastic wait (2s)"
            in said[lost]), said[lost]
    shrunk = said.index("[monarch-spmd] restart 1 runs 1 of 2 workers (WORLD_SIZE 1, elastic: at least 1): the gang "
                        "shrank from 2 to 1 worker without worker 1, lost in restart 0 (not counted against "
                        "maxRestarts: a lost worker is a disruption)")
    again = said.index("[monarch-spmd] starting worker 1 again (restart 1 runs without it), as the operator creates a "
                       "pod for a lost one: the gang grows back when it joins")
    grows = said.index("[monarch-spmd] worker 1 is ready: the gang grows from 1 to 2 workers, every rank restarts "
                       "in place with it (a membership change, not counted against maxRestarts)")
    grew = said.index("[monarch-spmd] restart 2 runs 2 of 2 workers (WORLD_SIZE 2, elastic: at least 1): the gang "
                      "grew back from 1 to 2 workers with worker 1 (a membership change, not counted against "
                      "maxRestarts)")
    # The smaller round started only after the elastic wait (the coordinator's all_running), and
    # worker 1 was started again once it ran.
    running = next(i for i, line in enumerate(said) if "restart 1: every rank is running again" in line)
    assert lost < shrunk < running < again < grows < grew, "\n".join(said)
    back = re.search(r"restart 1: every rank is running again, ([\d.]+)s after the failure", said[running])
    assert back and float(back.group(1)) >= WAIT, said[running]
    # A new worker 1 (a new process), started once, in restart 1.
    restarted = worker_pids(out, 1)
    assert len(restarted) == 2 and restarted[1] != killed, restarted
    assert re.search(rf"monarch-spmd worker: ranks 1\.\.1/2 .* restart 1/0, pid {restarted[1]}", out), out[-3000:]
    # Rank 0 alone in the smaller round (WORLD_SIZE 1, said above); both finished together at full size.
    assert "monarch-spmd worker: restart 1: starting rank 0 again (TORCHELASTIC_RESTART_COUNT=1)" in out
    assert not re.search(r"elastic_steps rank 1 world \d restart 1", out), "no rank 1 in the smaller round"
    for rank in range(2):
        assert re.search(rf"elastic_steps rank {rank} world 2 restart 2 done at step \d+", out), out[-3000:]
    assert ("[monarch-spmd] elastic: restart 0 ran 2, restart 1 ran 1, restart 2 ran 2 of 2 workers; 2 restarts, "
            "0 counted against maxRestarts (at most 0), 2 not (lost workers and workers back are disruptions)") in said
    assert said[-1] == "[monarch-spmd] all 2 ranks succeeded", "\n".join(said)
    assert "restarts used up" not in out and "lost (its worker is gone)" not in out and "job failed" not in out


def test_the_programs_failures_still_count_in_an_elastic_run_and_its_losses_do_not(spawn, tmp_path):
    fail = tmp_path / "fail"
    proc = spawn(cli_cmd("run", "--nnodes", "1:2", "--nproc-per-node", "1", "--elastic-wait", str(WAIT),
                         "--grace-period", "3", "--max-restarts", "1", "-m", PROGRAM, "--stop-file",
                         str(tmp_path / "stop"), "--step-seconds", "0.1", "--fail-file", str(fail), "--fail-rank", "1"))
    lose_worker_1_and_wait_until_it_is_back(proc)  # restarts 1 and 2: disruptions
    fail.touch()  # rank 1 now exits 1 in every round: the program's failures
    assert proc.finish(120) == 1, proc.text
    out = proc.text
    said = notes(out)
    # Restart 3 is the first that counts: one of at most one.
    assert ("[monarch-spmd] restarting the gang (restart 3, 1 of at most 1 counted: 2 were disruptions) in place"
            in said), "\n".join(said)
    assert re.search(r"elastic_steps rank 1 world 2 restart 3 failing with code 1", out), out[-3000:]
    assert ("[monarch-spmd] elastic: restart 0 ran 2, restart 1 ran 1, restart 2 ran 2 of 2 workers; 3 restarts, "
            "1 counted against maxRestarts (at most 1), 2 not (lost workers and workers back are disruptions)") in said
    # The table is restart 3's: both ranks of the full gang, none marked lost.
    table = said.index("[monarch-spmd] restart 3, every rank's last process:")
    rows = said[table + 2:table + 4]
    assert re.search(r"\] +0 +0 +pid \d+ ", rows[0]), rows
    assert re.search(r"\] +1 +0 +pid \d+ +1 +first failure$", rows[1]), rows
    assert "lost (its worker is gone)" not in out
    assert said[-1] == ("[monarch-spmd] job failed: rank 1 exited with code 1 (restarts used up: 1 of at most 1; "
                        "2 more were disruptions, not counted)"), "\n".join(said)


def test_losing_rank_0s_worker_recreates_an_elastic_gang_uncounted(spawn, tmp_path):
    # The coordinator lives in worker 0 (member 0 is in every round): its loss recreates the gang,
    # as the operator recreates it for a lost rank-0 pod, and that is a disruption too.
    proc = start(spawn, tmp_path)  # --max-restarts 0
    proc.wait_for(r"elastic_steps rank 1 world 2 restart 0 step 2\b")
    killed = worker_pids(proc.text, 0)[0]
    os.kill(killed, signal.SIGKILL)
    proc.wait_for(r"\[monarch-spmd\] new gang at restart 1: 2 ranks")
    proc.wait_for(r"elastic_steps rank [01] world 2 restart 1 step 1\b", count=2)  # the new gang trains
    (tmp_path / "stop").touch()
    assert proc.finish(120) == 0, proc.text
    said = notes(proc.text)
    assert ("[monarch-spmd] the worker of rank 0 was killed by SIGKILL (exit code 137): worker 0 (the coordinator's) "
            "is lost, a disruption not counted against maxRestarts; recreating the gang (restart 1, 0 of at most 0 "
            "counted)") in said, "\n".join(said)
    assert said[-1] == "[monarch-spmd] all 2 ranks succeeded", "\n".join(said)
    assert "job failed" not in proc.text


def test_an_elastic_wait_is_refused_for_a_fixed_size():
    refused = run(cli_cmd("run", "--nnodes", "2", "--nproc-per-node", "1", "--elastic-wait", "2", "-m", PROGRAM,
                          "--stop-file", "unused"))
    assert refused.returncode == 2, refused.stderr
    assert "--elastic-wait 2: only an elastic job waits for absent nodes; give --nnodes MIN:MAX" in refused.stderr
