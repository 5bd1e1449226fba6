"""Reports where MASTER_ADDR leads, then (first attempt only) fails on rank 1 to force a restart.

Prints ``MASTER {json}`` with RANK, the attempt (TORCHELASTIC_RESTART_COUNT), MASTER_ADDR, the
address it resolves to and the pod's own IP (POD_IP). On attempt 0 rank 1 exits 3; every other
rank sleeps ``--sleep`` seconds and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep", type=float, default=5.0)
    opts = parser.parse_args()
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    addr = os.environ["MASTER_ADDR"]
    seen = {"rank": rank, "restart": restart, "MASTER_ADDR": addr, "master_ip": socket.gethostbyname(addr),
            "POD_IP": os.environ.get("POD_IP")}
    print("MASTER " + json.dumps(seen), flush=True)
    if restart == 0 and rank == 1:
        return 3
    time.sleep(opts.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
