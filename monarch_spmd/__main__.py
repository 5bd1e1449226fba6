"""``python -m monarch_spmd``: the ``monarch-spmd`` command (:func:`monarch_spmd.cli.main`).

Where it sits: the top of the library, beside :mod:`monarch_spmd.cli`, which it only calls; it
works where the console script is not on PATH (a checkout, another interpreter's site-packages).
"""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
