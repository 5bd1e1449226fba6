"""Summarize py-spy raw (collapsed) stacks: where a process spent its samples.

    python -m benchmarks.profile_summary FILE [FILE...] [--top 25]

Prints the frames with the most samples on top of the stack (self) and anywhere on it
(inclusive), grouped by function and file, line numbers dropped.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def frame_key(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{m.group('fn')} ({file})"


def summarize(paths: list[str | Path], top: int = 25) -> dict:
    self_c: collections.Counter[str] = collections.Counter()
    incl_c: collections.Counter[str] = collections.Counter()
    total = 0
    for p in paths:
        for line in Path(p).read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [frame_key(f) for f in stack.split(";") if f]
            if not frames:
                continue
            total += n
            self_c[frames[-1]] += n
            for f in set(frames):
                incl_c[f] += n
    return {
        "samples": total,
        "self": [(f, c, c / total if total else 0.0) for f, c in self_c.most_common(top)],
        "inclusive": [(f, c, c / total if total else 0.0) for f, c in incl_c.most_common(top)],
    }


def render(s: dict) -> str:
    out = [f"samples: {s['samples']}", "", "self (top of stack):"]
    out += [f"  {pct:6.1%}  {c:6d}  {f}" for f, c, pct in s["self"]]
    out += ["", "inclusive (anywhere on the stack):"]
    out += [f"  {pct:6.1%}  {c:6d}  {f}" for f, c, pct in s["inclusive"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    print(render(summarize(args.files, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
