"""Exits through sys.exit with the code given as argv[1] (after printing its argv and rank)."""

import os
import sys

print(f"exit_with rank {os.environ.get('RANK')} argv {sys.argv}", flush=True)
code = sys.argv[1] if len(sys.argv) > 1 else "0"
sys.exit(int(code) if code.lstrip("-").isdigit() else code)
