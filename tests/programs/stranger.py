"""A stranger on the cluster network: every move that drove a gang's coordinator without proof of
membership, against ``--addr``:``--port``, each answer printed as one JSON line.

The moves: read as an observer, claim member 1 and report a permanent failure for it, claim
member 0 with a malformed ``disruptions``, an inflated one, a guessed token, an oversized line,
and a connection that never says hello (how long until the coordinator closes it). The last line
says how many bytes came back in all and whether any of them was the gang's output.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

MOVES = {
    "observe": [{"type": "hello", "role": "observer", "versions": [1]}],
    "claim-member-and-fail": [
        {"type": "hello", "role": "member", "member": 1, "versions": [1], "incarnation": "stranger"},
        {"type": "failure", "round": 0, "rank": 1, "exit_code": 64, "message": "injected by a stranger"}],
    "disruptions-lots": [{"type": "hello", "role": "member", "member": 0, "versions": [1], "disruptions": "lots"}],
    "disruptions-huge": [{"type": "hello", "role": "member", "member": 1, "versions": [1], "disruptions": 10**9}],
    "guessed-token": [{"type": "hello", "role": "observer", "versions": [1], "token": "A" * 43}],
}


def move(addr: str, port: int, lines: list[bytes]) -> bytes:
    with socket.create_connection((addr, port), timeout=15) as s:
        try:
            s.sendall(b"".join(lines))
        except OSError:
            pass  # closed before all was sent (an oversized line): what came back is the answer
        s.settimeout(15)
        got = b""
        while True:
            try:
                data = s.recv(65536)
            except OSError:
                break
            if not data:
                break
            got += data
        return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--marker", default="train_steps", help="text of the gang's output to look for")
    opts = parser.parse_args()
    received = b""
    for name, messages in MOVES.items():
        got = move(opts.addr, opts.port, [json.dumps(m).encode() + b"\n" for m in messages])
        received += got
        first = got.split(b"\n", 1)[0]
        answer = json.loads(first) if first else None
        print(json.dumps({"move": name, "answer": answer, "bytes": len(got)}), flush=True)
    got = move(opts.addr, opts.port, [b"x" * (2 << 20) + b"\n"])
    received += got
    print(json.dumps({"move": "oversized", "answer": json.loads(got.split(b"\n", 1)[0]) if got else None,
                      "bytes": len(got)}), flush=True)
    began = time.monotonic()
    with socket.create_connection((opts.addr, opts.port), timeout=60) as silent:
        silent.settimeout(60)
        try:
            closed = silent.recv(100) == b""
        except OSError:
            closed = False
    print(json.dumps({"move": "silent", "closed": closed, "seconds": round(time.monotonic() - began, 2)}), flush=True)
    print(json.dumps({"received": len(received), "output_seen": opts.marker.encode() in received}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
