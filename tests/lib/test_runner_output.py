"""What `monarch-spmd run` shows: a progress bar as it moves, a failed run's per-rank table and a
last line naming the failing rank (siblings the agents stopped are not failures), the same
MASTER_PORT across restarts, and torchrun's --tee/--redirects/--log-dir files. The real runner,
real ranks."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import threading
import time

from .conftest import ROOT, cli_cmd, free_port, run

PROGRAMS = "tests.programs"


def timed_stderr(cmd: list[str], timeout: float = 120.0) -> tuple[int, list[tuple[float, bytes]]]:
    """Runs ``cmd``; returns its exit code and every chunk of its stderr with when it arrived."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    chunks: list[tuple[float, bytes]] = []

    def read() -> None:
        assert proc.stderr is not None
        while True:
            data = os.read(proc.stderr.fileno(), 65536)
            if not data:
                return
            chunks.append((time.monotonic(), data))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    code = proc.wait(timeout)
    thread.join(10)
    return code, chunks


def arrival(chunks: list[tuple[float, bytes]], needle: bytes) -> float:
    seen = b""
    for t, data in chunks:
        seen += data
        if needle in seen:
            return t
    raise AssertionError(f"{needle!r} never arrived in {seen!r}")


def test_a_progress_bar_arrives_step_by_step_with_its_rank_prefix(tmp_path):
    code, chunks = timed_stderr(cli_cmd("run", "--nproc-per-node", "1", "-m", f"{PROGRAMS}.resume_training",
                                        "--checkpoint-dir", str(tmp_path), "--steps", "5", "--step-seconds", "1",
                                        "--progress-bar"))
    everything = b"".join(d for _, d in chunks)
    assert code == 0, everything
    assert b"\r[rank 0] step 1/5\r[rank 0] step 2/5" in everything  # each rewrite keeps its prefix
    # Step 1 arrives about four seconds before step 5: not held back until the bar's final newline.
    assert arrival(chunks, b"step 5/5") - arrival(chunks, b"step 1/5") > 2.5


def test_a_failed_run_ends_with_a_table_of_every_rank_and_a_last_line_naming_the_failure():
    result = run(cli_cmd("run", "--nnodes", "2", "--nproc-per-node", "2", "--shutdown-timeout", "3",
                         "-m", f"{PROGRAMS}.fail_once", "--rank", "2", "--code", "7", "--sleep", "600"))
    assert result.returncode == 7, result.stderr
    lines = result.stderr.splitlines()
    assert lines[-1] == "[monarch-spmd] job failed: rank 2 exited with code 7 (no restarts allowed: maxRestarts 0)"
    table = lines[lines.index("[monarch-spmd] restart 0, every rank's last process:"):-1]
    assert table[1].split() == ["[monarch-spmd]", "rank", "local", "rank", "process", "exit", "code"]
    rows = {int(line.split()[1]): line for line in table[2:]}
    assert sorted(rows) == [0, 1, 2, 3]
    assert re.search(r"\] +2 +0 +pid \d+ +7 +first failure$", rows[2]), rows[2]
    for rank, local in ((0, 0), (1, 1), (3, 1)):
        assert re.search(rf"\] +{rank} +{local} +pid \d+ +-15 \(SIGTERM\) +stopped \(after the first failure\)$", rows[rank])
    # Only rank 2 is said to have failed: the siblings the agents stopped are not failures.
    said = [line for line in lines if "exited with code" in line or "was killed" in line]
    assert all("rank 2" in line for line in said), said


def test_a_rank_killed_by_a_signal_reads_as_torchrun_prints_it():
    # Rank 0 writes for 1 s and ends; the gang is then silent, and rank 1 hung (SIGSTOP) is killed.
    result = run(cli_cmd("run", "--nproc-per-node", "2", "--progress-timeout", "2", "-m", f"{PROGRAMS}.hang",
                         "--rank", "1", "--seconds", "1"))
    assert result.returncode == 137, result.stderr
    assert re.search(r"\] +1 +1 +pid \d+ +-9 \(SIGKILL\) +first failure \(NoProgress\)$", result.stderr, re.M), result.stderr
    last = result.stderr.splitlines()[-1]
    assert re.match(r"\[monarch-spmd\] job failed: rank 1 was killed by SIGKILL \(exit code 137\): NoProgress "
                    r"\(rank 1 wrote nothing for \d+s \(progress timeout 2s\); last line: hang rank 1: about to hang\)",
                    last), last


def test_restarts_keep_the_master_port_and_resume_from_the_checkpoint(tmp_path):
    result = run(cli_cmd("run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
                         "-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path), "--steps", "3",
                         "--fail-rank", "1", "--fail-step", "1"), timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    masters = set(re.findall(r"resume_training rank \d pid \d+ restart \d from step \d master (\S+)", out))
    assert len(masters) == 1, masters  # torchrun keeps MASTER_PORT across restarts, and so does an in-place restart
    assert "resume_training rank 0 pid" in out and re.search(r"rank 0 pid \d+ restart 1 from step 1", out)
    assert "restarting the gang (restart 1 of at most 1) in place" in out
    assert re.search(r"restart 1: every rank is running again, [\d.]+s after the failure", out)


def test_tee_redirects_and_log_dir_write_torchruns_files(tmp_path):
    logs = tmp_path / "logs"
    result = run(cli_cmd("run", "--nnodes", "1", "--nproc-per-node", "2", "--log-dir", str(logs), "--redirects", "1",
                         "--tee", "0:2", "--rdzv-id", "job9", "--master-port", str(free_port()),
                         "-m", f"{PROGRAMS}.fail_once", "--rank", "9", "--no-rendezvous"))
    assert result.returncode == 0, result.stderr
    runs = glob.glob(str(logs / "job9_*"))
    assert len(runs) == 1, os.listdir(logs)  # <log dir>/<run id>_<random>, as torchrun's DefaultLogsSpecs
    attempt = os.path.join(runs[0], "attempt_0")
    assert sorted(os.listdir(attempt)) == ["0", "1"]
    for local in (0, 1):
        with open(os.path.join(attempt, str(local), "stdout.log")) as f:
            assert f"fail_once rank {local} pid" in f.read()
    # --redirects 1: stdout only to the files; --tee 0:2: rank 0's stderr also to a file and the console.
    assert "fail_once rank" not in result.stdout
    assert os.path.exists(os.path.join(attempt, "0", "stderr.log"))
    assert not os.path.exists(os.path.join(attempt, "1", "stderr.log"))
    assert f"log directory set to: {runs[0]}" in result.stderr


def test_without_a_log_dir_tee_writes_to_a_fresh_temporary_folder(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = run(cli_cmd("run", "--nproc-per-node", "1", "--tee", "3", "-m", f"{PROGRAMS}.fail_once", "--rank", "9",
                         "--no-rendezvous"), env=env)
    assert result.returncode == 0, result.stderr
    assert "[rank 0] fail_once rank 0 pid" in result.stdout  # tee: the console too
    files = glob.glob(str(tmp_path / "torchelastic_*" / "*" / "attempt_0" / "0" / "stdout.log"))
    with open(files[0]) as f:
        assert len(files) == 1 and "fail_once rank 0 pid" in f.read()
