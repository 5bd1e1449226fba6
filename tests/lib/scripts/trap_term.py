"""Prints "ready" and its pid, then waits for SIGTERM; on it prints "got SIGTERM" and exits 42."""

import os
import signal
import sys
import time


def on_term(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(42)


signal.signal(signal.SIGTERM, on_term)
print(f"ready pid {os.getpid()}", flush=True)
time.sleep(300)
sys.exit(1)
