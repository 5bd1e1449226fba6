"""Changes os.environ, sys.argv and sys.path, imports a module beside it, then exits as argv[1] says."""

import os
import sys

import sibling_module  # found only if the script's folder is on sys.path, as under `python path.py`

os.environ["MONARCH_SPMD_TEST_LEAK"] = "leaked"
os.environ.pop("MONARCH_SPMD_TEST_KEEP", None)
sys.argv.append("--mutated")
sys.path.append("/nonexistent/mutated")
print(f"mutate_state rank {os.environ['RANK']}: {sibling_module.VALUE}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] != "--mutated":
    sys.exit(int(sys.argv[1]))
