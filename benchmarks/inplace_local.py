"""Restart in place, coordinated by the agents: the local runner at 16 .. 1,024 ranks, and hangs.

    python -m benchmarks.inplace_local [--ranks 16 64 256 1024] [--per-host 16] [--reps 3]
                                       [--hang-ranks 16] [--hang-timeout 3] [--json PATH]

The same agent and coordinator code as pods (docs/restart-in-place.md), run by ``monarch-spmd
run``'s runner (``monarch_spmd.runner.run``, in a thread of this process, which watches the
coordinator as an observer). The PerHost layout, ``--per-host`` procs per worker (a "host"), so
1,024 ranks are 64 workers of 16 and two cores can hold them; the program is trivial
(``benchmarks/inplace_program.py --mode sleep``: it marks itself ready and turns into
``sleep``). Back-off is off (0 s): it is a policy (10 s before a second restart in a row by
default), not coordination.

Restart: for each N, once every rank of the round runs its program, one rank (of a different
worker each time) is SIGKILLed; the figure is the time from the kill to the coordinator's
``all_running`` of the next round (every worker has started every new process of its host),
median of ``--reps`` restarts in one run. Beside it: the time to the ``failure`` event
(detected), to ``started`` (every worker stopped its processes and the barrier opened: the
coordination itself), and the floor: one process starting the same N programs with the same
pre-exec hook, no coordination (what this machine's CPUs allow for starting N interpreters).

Hangs (``--hang-ranks`` ranks, ``--mode steps``: a line every 0.5 s): one rank is SIGSTOPped; the
figure is the time from the stop to the ``failure`` event (detected) and to ``all_running`` of
the next round (restarted), with torchrun's watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1, a
``--hang-timeout`` timer armed around each step, written in torch's request format) and with the
progress timeout (``--hang-timeout`` seconds without output). The target is detection within
the timeout + 2 s.

JSON goes to ``benchmarks/out/inplace_local.json``.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import machine, machine_line, median, table, write_json
from monarch_spmd import runner
from monarch_spmd.payload import agent, rendezvous

PROGRAM = "benchmarks.inplace_program"


class Watch:
    """The coordinator's events as the runner's observer hands them over, and waiting for one."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()

    def __call__(self, message: dict[str, Any]) -> None:
        with self.cond:
            # A welcome carries the job-level events sent before the observer connected (a small
            # gang can be running before the first connection): they count as seen.
            seen = {e.get("seq") for e in self.events}
            self.events.extend(e for e in message.get("history") or [] if e.get("seq") not in seen)
            self.events.append(message)
            self.cond.notify_all()

    def wait(self, kind: str, timeout: float, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for event in self.events:
                    if event.get("type") == kind and all(event.get(k) == v for k, v in fields.items()):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {kind} event with {fields} within {timeout:g}s")
                self.cond.wait(min(left, 0.5))

class Job:
    """One local run in a thread: the runner, its log, its observer's events."""

    def __init__(self, ranks: int, per_host: int, argv: list[str], max_restarts: int, *,
                 progress_timeout: float | None = None, env: dict[str, str] | None = None) -> None:
        self.watch = Watch()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="inplace_local_", suffix=".log", delete=False)
        hosts = max(1, ranks // per_host)
        mesh = f"hosts={hosts},procs={min(ranks, per_host)}"
        self.job = runner.job_from_args(mesh, argv, max_restarts=max_restarts, pod_layout="PerHost")
        self.progress_timeout = progress_timeout
        self.env = env or {}
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.code = runner.run(self.job, stdout=io.TextIOWrapper(open(os.devnull, "wb")), stderr=self.log,
                               grace_period=5.0, backoff=0.0, member_failure_limit=1000,
                               progress_timeout=self.progress_timeout, on_event=self.watch)

    def __enter__(self) -> Job:
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)  # the workers take this process's environment
        try:
            self.thread.start()
            self.watch.wait(rendezvous.WELCOME, 120)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(300)
        self.log.close()
        if exc[0] is not None:
            with open(self.log.name) as f:
                sys.stderr.write(f"--- the runner's log ({self.log.name}), last lines:\n" + "".join(f.readlines()[-40:]))
        else:
            os.unlink(self.log.name)


def ready_pids(ready: str, round_: int) -> dict[int, int]:
    """rank -> pid of the round's processes, from the files they wrote (``running`` events come
    only while an observer is connected, which a fast gang can beat)."""
    pids = {}
    for name in os.listdir(ready):
        restart, _, rank = name.partition(".")
        if restart == str(round_):
            with open(os.path.join(ready, name)) as f:
                pids[int(rank)] = int(f.read())
    return pids


def wait_ready(ready: str, round_: int, ranks: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    prefix = f"{round_}."
    while sum(1 for n in os.listdir(ready) if n.startswith(prefix)) < ranks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"round {round_}: not every rank started its program within {timeout:g}s")
        time.sleep(0.1)


def restart_times(ranks: int, per_host: int, reps: int) -> dict[str, Any]:
    """``reps`` restarts of an N-rank gang, each caused by a SIGKILLed rank."""
    samples, detections, coordinator, barrier = [], [], [], []
    budget = 120 + ranks / 4
    with tempfile.TemporaryDirectory() as ready:
        argv = ["-m", PROGRAM, "--mode", "sleep", "--ready-dir", ready]
        with Job(ranks, per_host, argv, reps) as job:
            for r in range(reps + 1):
                job.watch.wait(rendezvous.EV_ALL_RUNNING, budget, round=r)
                wait_ready(ready, r, ranks, budget)
                time.sleep(0.5)  # let the last interpreters settle into sleep
                victim = ready_pids(ready, r)[(ranks // 2 + r * per_host) % ranks]
                t0 = time.time()
                os.kill(victim, signal.SIGKILL)
                if r == reps:
                    break  # the restarts are used up: this kill ends the job
                failure = job.watch.wait(rendezvous.EV_FAILURE, budget, round=r)
                started = job.watch.wait(rendezvous.EV_STARTED, budget, round=r + 1)
                again = job.watch.wait(rendezvous.EV_ALL_RUNNING, budget, round=r + 1)
                samples.append(again["time"] - t0)
                detections.append(failure["time"] - t0)
                barrier.append(started["time"] - t0)
                since = again.get("seconds_since_failure")
                coordinator.append(float(since) if since is not None else again["time"] - failure["time"])
    floor = spawn_floor(ranks)
    return {"ranks": ranks, "hosts": max(1, ranks // per_host), "per_host": min(ranks, per_host),
            "restart_s": samples, "detect_s": detections, "barrier_s": barrier, "coordinator_s": coordinator,
            "restart_median_s": median(samples), "detect_median_s": median(detections),
            "barrier_median_s": median(barrier), "coordinator_median_s": median(coordinator), "spawn_floor_s": floor}


def spawn_floor(ranks: int) -> float:
    """Seconds for one process to start ``ranks`` of the program with the agents' pre-exec hook."""
    hook = agent.parent_death_hook(signal.SIGKILL)
    with tempfile.TemporaryDirectory() as ready:
        env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": "0"}
        procs = []
        t0 = time.monotonic()
        try:
            for rank in range(ranks):
                procs.append(subprocess.Popen([sys.executable, "-m", PROGRAM, "--mode", "sleep", "--ready-dir", ready],
                                              env={**env, "RANK": str(rank)}, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              start_new_session=True, preexec_fn=hook))
            elapsed = time.monotonic() - t0
            wait_ready(ready, 0, ranks, 120 + ranks / 4)
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
                for pipe in (p.stdout, p.stderr):
                    if pipe is not None:
                        pipe.close()
    return elapsed


def hang_times(ranks: int, per_host: int, reps: int, timeout: float, detector: str) -> dict[str, Any]:
    """``reps`` hangs (a SIGSTOPped rank) found by the watchdog or by the progress timeout."""
    detections, restarts, reasons = [], [], set()
    with tempfile.TemporaryDirectory() as ready:
        argv = ["-m", PROGRAM, "--mode", "steps", "--step", "0.5", "--ready-dir", ready]
        env: dict[str, str] = {}
        progress = None
        if detector == "watchdog":
            argv += ["--watchdog", f"{timeout:g}"]
            env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1"
        else:
            progress = timeout
        with Job(ranks, per_host, argv, reps, progress_timeout=progress, env=env) as job:
            for r in range(reps):
                job.watch.wait(rendezvous.EV_ALL_RUNNING, 120, round=r)
                wait_ready(ready, r, ranks, 120)
                time.sleep(1.5)  # a few steps: timers armed, lines written
                victim = ready_pids(ready, r)[ranks // 2]
                t0 = time.time()
                os.kill(victim, signal.SIGSTOP)
                failure = job.watch.wait(rendezvous.EV_FAILURE, 120, round=r)
                again = job.watch.wait(rendezvous.EV_ALL_RUNNING, 120, round=r + 1)
                detections.append(failure["time"] - t0)
                restarts.append(again["time"] - t0)
                reasons.add(failure["reason"])
            wait_ready(ready, reps, ranks, 120)
            time.sleep(1.0)
            victim = ready_pids(ready, reps)[0]
            os.kill(victim, signal.SIGKILL)  # the restarts are used up: this ends the job
    return {"detector": detector, "ranks": ranks, "timeout_s": timeout, "reasons": sorted(reasons),
            "detect_s": detections, "restart_s": restarts, "detect_median_s": median(detections),
            "restart_median_s": median(restarts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--per-host", type=int, default=16, help="procs per worker (PerHost)")
    parser.add_argument("--reps", type=int, default=3, help="restarts per size (the median is shown)")
    parser.add_argument("--hang-ranks", type=int, default=16, help="ranks of the hang runs (0: none)")
    parser.add_argument("--hang-timeout", type=float, default=3.0, help="watchdog timer and progress timeout (s)")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/out/inplace_local.json)")
    opts = parser.parse_args(argv)
    m = machine()
    print(f"# restart in place, local runner: {machine_line(m)}; os.cpu_count() = {os.cpu_count()}")
    results: dict[str, Any] = {"benchmark": "inplace_local", "machine": m,
                               "command": "python -m benchmarks.inplace_local " + " ".join(argv or sys.argv[1:]),
                               "restart": [], "hang": []}
    for ranks in opts.ranks:
        row = restart_times(ranks, opts.per_host, opts.reps)
        results["restart"].append(row)
        print(f"#   {ranks} ranks: {', '.join(f'{s:.2f}' for s in row['restart_s'])} s", flush=True)
    rows = [[r["ranks"], f"{r['hosts']} x {r['per_host']}", r["restart_median_s"], min(r["restart_s"]),
             max(r["restart_s"]), r["detect_median_s"], r["barrier_median_s"], r["spawn_floor_s"]]
            for r in results["restart"]]
    print("\nfailure (SIGKILL of one rank) -> every rank's new process started; medians of "
          f"{opts.reps} restarts, back-off off")
    print(table(["ranks", "workers x procs", "restart s", "min s", "max s", "detected s", "barrier open s",
                 "spawn floor s"], rows))
    if len(results["restart"]) > 1:
        first, last = results["restart"][0], results["restart"][-1]
        ratio = last["restart_median_s"] / first["restart_median_s"] if first["restart_median_s"] else None
        print(f"{last['ranks']} vs {first['ranks']} ranks: {ratio:.2f}x" if ratio else "")
    if opts.hang_ranks:
        for detector in ("watchdog", "progress"):
            results["hang"].append(hang_times(opts.hang_ranks, opts.per_host, opts.reps, opts.hang_timeout, detector))
        print(f"\nhang (SIGSTOP of one rank of {opts.hang_ranks}) -> detected, and every rank restarted; medians of "
              f"{opts.reps}")
        print(table(["detector", "timeout s", "detected s", "restarted s", "target s", "reason"],
                    [[h["detector"], h["timeout_s"], h["detect_median_s"], h["restart_median_s"], h["timeout_s"] + 2,
                      ",".join(h["reasons"])] for h in results["hang"]]))
    path = write_json("inplace_local", results, opts.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
