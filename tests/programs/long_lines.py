"""Long output lines, then a failure, for the large-history tests: ``long_lines --fail 0:1,1:0``.

Every rank prints ``--lines`` lines of ``--width`` characters (a traceback of a huge tensor, a
progress bar without newlines), then, where ``--fail`` names its rank for this attempt
(TORCHELASTIC_RESTART_COUNT:RANK pairs), exits with code 3; on an attempt ``--fail`` does not
name, it prints ``long_lines rank R steady at restart N`` and sleeps ``--sleep`` seconds.
``--go-file PATH``: the failing rank of the first attempt waits until PATH exists before it fails
(a test starts the failures once it has stopped the operator). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--width", type=int, default=20_000)
    parser.add_argument("--fail", default="")
    parser.add_argument("--sleep", type=float, default=120.0)
    parser.add_argument("--go-file", default="")
    opts = parser.parse_args()
    rank, restart = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    failing = {int(r): int(k) for r, _, k in (p.partition(":") for p in opts.fail.split(",") if p)}
    for i in range(opts.lines):
        print(f"long_lines rank {rank} restart {restart} line {i} " + "x" * opts.width, flush=True)
    if failing.get(restart) == rank:
        deadline = time.monotonic() + 600
        while restart == 0 and opts.go_file and not os.path.exists(opts.go_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"long_lines rank {rank} failing at restart {restart}", flush=True)
        return 3
    if restart not in failing:
        print(f"long_lines rank {rank} steady at restart {restart}", flush=True)
        time.sleep(opts.sleep)
        return 0
    time.sleep(opts.sleep)  # another rank fails this attempt: this one is stopped
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
