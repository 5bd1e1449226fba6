"""A smoke run of benchmarks/inplace_local.py at its smallest size: 8 ranks (2 workers of 4), one
restart, and one hang per detector on 2 ranks. No time is asserted (the machine is shared): the
benchmark runs as a user runs it, every restart and hang is seen through the coordinator's events,
and the JSON holds positive numbers and the reasons the agents gave."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_inplace_local_smoke(tmp_path: Path) -> None:
    out = tmp_path / "inplace.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.inplace_local", "--ranks", "8", "--per-host", "4",
                             "--reps", "1", "--hang-ranks", "2", "--hang-timeout", "2", "--json", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every rank's new process started" in result.stdout and "| 8     | 2 x 4" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "inplace_local" and data["command"].startswith("python -m benchmarks.inplace_local")
    (row,) = data["restart"]
    assert (row["ranks"], row["hosts"], row["per_host"]) == (8, 2, 4)
    assert len(row["restart_s"]) == 1 and row["restart_s"][0] > 0 and row["spawn_floor_s"] > 0
    assert 0 <= row["detect_s"][0] <= row["barrier_s"][0] <= row["restart_s"][0]
    hangs = {h["detector"]: h for h in data["hang"]}
    assert hangs["watchdog"]["reasons"] == ["WatchdogTimeout"] and hangs["progress"]["reasons"] == ["NoProgress"]
    for h in hangs.values():
        assert 0 < h["detect_s"][0] <= h["restart_s"][0]
