"""scripts/test.sh's orchestration, run for real on a copy of it whose build scripts and Python
are stand-ins that record what they were asked: the two build lanes run at once, every step and
the total print their time, a failed build stops the other lane and fails the run, and pytest's
exit codes (5, no tests, among them) decide the result."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: each build script's stand-in: name in the events file, path, the folder it prints
BUILDS = {
    "k8s": ("devcluster/build-binaries.sh", "/stub/k8s/bin"),
    "realnode": ("devcluster/build-realnode.sh", "/stub/realnode/bin"),
    "kueue": ("devcluster/build-kueue.sh", "/stub/kueue"),
    "jobset": ("benchmarks/build-jobset.sh", "/stub/jobset"),
    "pytorchjob": ("benchmarks/build-pytorchjob.sh", "/stub/pytorchjob"),
    "images": ("scripts/build-images.sh", "images\tref\t/stub/images/x.tar"),
}

STUB = r"""#!/usr/bin/env bash
# Stand-in for {path}: records its start, waits where told, fails where told.
set -u
ev="$STUB_DIR/events"
echo $$ > "$STUB_DIR/{name}.pid"
echo "start {name} $$" >> "$ev"
wait_for() {{  # another stand-in's start, within 60 s
  for _ in $(seq 600); do grep -q "^start $1 " "$ev" && return 0; sleep 0.1; done
  echo "stub {name}: $1 never started while {name} ran" >&2; exit 99
}}
for other in ${{STUB_WAIT_{var}:-}}; do wait_for "$other"; done
if [ -n "${{STUB_SLEEP_{var}:-}}" ]; then sleep "$STUB_SLEEP_{var}"; fi
if [ "${{STUB_FAIL:-}}" = {name} ]; then echo "stub {name}: failing" >&2; exit 3; fi
echo "end {name}" >> "$ev"
printf '%s\n' 'progress' '{out}'
"""

PYTHON = r"""#!/usr/bin/env bash
# Stand-in for the interpreter: pip, the import check and pytest record their arguments.
set -u
ev="$STUB_DIR/events"
case "$1 ${2:-}" in
  "-m pip") echo $$ > "$STUB_DIR/pip.pid"; echo "start pip $$" >> "$ev"
    if [ -n "${STUB_SLEEP_PIP:-}" ]; then sleep "$STUB_SLEEP_PIP"; fi
    if [ -n "${STUB_WAIT_PIP:-}" ]; then
      for _ in $(seq 600); do grep -q "^start $STUB_WAIT_PIP " "$ev" && break; sleep 0.1; done
      grep -q "^start $STUB_WAIT_PIP " "$ev" || { echo "stub pip: $STUB_WAIT_PIP never started" >&2; exit 99; }
    fi
    echo "end pip" >> "$ev" ;;
  "scripts/check-imports.py ") echo "start imports $$" >> "$ev"; exit "${STUB_IMPORTS_RC:-0}" ;;
  "-m pytest") shift 2
    echo "start pytest $* K8S=$MONARCH_SPMD_K8S_BIN REAL=$MONARCH_SPMD_REALNODE_BIN KUEUE=$MONARCH_SPMD_KUEUE_DIR" >> "$ev"
    exit "${STUB_PYTEST_RC:-0}" ;;
  *) echo "stub python: unexpected $*" >&2; exit 98 ;;
esac
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of scripts/test.sh beside stand-ins for everything it runs."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    (work / "scripts" / "test.sh").write_text((ROOT / "scripts" / "test.sh").read_text())
    for name, (path, out) in BUILDS.items():
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(STUB.format(name=name, path=path, out=out, var=name.upper()))
    stub_bin = tmp_path / "bin"
    stub_bin.mkdir()
    (stub_bin / "python").write_text(PYTHON)
    (stub_bin / "python").chmod(0o755)
    # Were a system tool missing here, test.sh's apt-get would meet this one, not Debian's.
    (stub_bin / "apt-get").write_text('#!/bin/sh\necho "apt-get $*" >> "$STUB_DIR/events"\n')
    (stub_bin / "apt-get").chmod(0o755)
    # scripts/pip-install.sh's stand-in hands over to the Python stand-in's pip.
    (work / "scripts" / "pip-install.sh").write_text('exec "$PYTHON" -m pip install "$@"\n')
    (tmp_path / "events").touch()
    return work


def run(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    stubs = tree.parent
    full = dict(os.environ, STUB_DIR=str(stubs), PYTHON=str(stubs / "bin" / "python"),
                PATH=f"{stubs / 'bin'}:{os.environ['PATH']}", **env)
    for var in ("MONARCH_SPMD_K8S_BIN", "MONARCH_SPMD_REALNODE_BIN", "MONARCH_SPMD_KUEUE_DIR"):
        full.pop(var, None)
    return subprocess.run(["bash", str(tree / "scripts" / "test.sh"), *args], env=full,
                          capture_output=True, text=True, timeout=120, start_new_session=True)


def running(pid: int) -> bool:
    """True while the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def events(tree: Path) -> list[str]:
    return (tree.parent / "events").read_text().splitlines()


def test_the_three_lanes_run_at_once_and_every_step_says_its_time(tree: Path):
    # pip (pip lane) returns only once the cluster binaries' build (Go lane) has started, that
    # build only once the images' build (images lane) has, and that one only once pip has: one
    # lane after another would never get there.
    result = run(tree, "-q", "-x", STUB_WAIT_PIP="k8s", STUB_WAIT_K8S="images", STUB_WAIT_IMAGES="pip")
    assert result.returncode == 0, result.stdout + result.stderr
    started = [e.split()[1] for e in events(tree) if e.startswith("start ")]
    assert sorted(started) == sorted(["pip", "imports", "pytest", *BUILDS])
    assert started[-1] == "pytest"
    pytest_line = next(e for e in events(tree) if e.startswith("start pytest "))
    # two xdist workers, each session cluster's tests kept together (tests/conftest.py)
    assert pytest_line.startswith("start pytest -p no:cacheprovider --durations=30 -n 2 --dist loadgroup -q -x ")
    assert "K8S=/stub/k8s/bin REAL=/stub/realnode/bin KUEUE=/stub/kueue" in pytest_line
    one = run(tree, "-q", MONARCH_SPMD_TEST_WORKERS="0")
    assert one.returncode == 0, one.stdout + one.stderr
    assert events(tree)[-1].startswith("start pytest -p no:cacheprovider --durations=30 -q K8S="), "0 workers: plain pytest"
    out = result.stdout
    for line in ("cluster binaries in /stub/k8s/bin (", "real-node binaries in /stub/realnode/bin (",
                 "Kueue in /stub/kueue (", "JobSet ready (", "PyTorchJob's operator ready (",
                 "Python dependencies (", "every import declared (", "container images ready (",
                 "system packages (", "builds (", "pytest ("):
        assert f"test.sh: {line}" in out, out
    last = out.splitlines()[-1]
    assert last.startswith("test.sh: total ") and ", pytest " in last, out


def test_a_failed_build_stops_the_other_lanes_and_fails_the_run(tree: Path):
    # The cluster binaries fail while pip and the images' build still run (each would run 300 s).
    result = run(tree, STUB_WAIT_K8S="images pip", STUB_FAIL="k8s", STUB_SLEEP_IMAGES="300",
                 STUB_SLEEP_PIP="300")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stub k8s: failing" in result.stderr
    assert "test.sh: a build failed (above); stopping the others" in result.stdout
    assert not any(e.startswith("start pytest") for e in events(tree))
    for name in ("images", "pip"):  # stopped, not left running
        assert not running(int((tree.parent / f"{name}.pid").read_text())), name
    assert "end images" not in events(tree) and "end pip" not in events(tree)


def test_an_undeclared_import_fails_before_pytest(tree: Path):
    result = run(tree, STUB_IMPORTS_RC="1")
    assert result.returncode == 1
    assert not any(e.startswith("start pytest") for e in events(tree))


@pytest.mark.parametrize(("pytest_rc", "rc"), [(0, 0), (1, 1), (2, 2), (5, 1)])
def test_pytests_exit_code_decides_and_no_tests_is_a_failure(tree: Path, pytest_rc: int, rc: int):
    result = run(tree, STUB_PYTEST_RC=str(pytest_rc))
    assert result.returncode == rc, result.stdout + result.stderr
    no_tests = "test.sh: pytest collected no tests; that is a failure of the suite"
    assert (no_tests in result.stderr) == (pytest_rc == 5)


def test_an_interrupted_run_stops_its_builds(tree: Path):
    stubs = tree.parent
    env = dict(os.environ, STUB_DIR=str(stubs), PYTHON=str(stubs / "bin" / "python"),
               PATH=f"{stubs / 'bin'}:{os.environ['PATH']}", STUB_SLEEP_K8S="300",
               STUB_SLEEP_IMAGES="300")
    # SIGINT as a terminal's Ctrl-C delivers it: not ignored, even where this test runs in the
    # background of a shell (which starts its background jobs with SIGINT ignored, and a shell
    # cannot trap a signal ignored when it started).
    proc = subprocess.Popen(["bash", str(tree / "scripts" / "test.sh")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for name in ("k8s", "images"):
            pid_file = stubs / f"{name}.pid"
            for _ in range(600):
                if pid_file.exists() and pid_file.read_text().strip():
                    break
                subprocess.run(["sleep", "0.1"], check=True)
            assert pid_file.exists(), f"{name} never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    for name in ("k8s", "images"):
        assert not running(int((stubs / f"{name}.pid").read_text())), name
    assert "test.sh: total " in out.splitlines()[-1]
