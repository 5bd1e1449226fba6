"""Prints the torchrun variables and argv as one JSON line, then exits 0."""

import json
import os
import sys

keys = [k for k in os.environ if k.startswith(("TORCH", "RANK", "WORLD", "LOCAL_", "GROUP_", "ROLE_", "MASTER_", "OMP_", "CUDA_"))]
print(json.dumps({"argv": sys.argv, "env": {k: os.environ[k] for k in sorted(keys)}}), flush=True)
