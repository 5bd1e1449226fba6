"""Small training scripts for trying and testing monarch-spmd, each runnable with ``-m``.

Where they sit: outside the library's layers; nothing in ``monarch_spmd`` imports them. Each
script takes everything it needs from the environment (the torchrun variables, and the
MONARCH_SPMD_* inputs when a worker started it) and its arguments, and imports only the standard
library and torch, so the same file runs under ``monarch-spmd run``, in an SPMDJob pod, through
``SPMDActor.main`` and under plain ``torchrun``.

* ``allreduce``: gloo all_reduce of rank+1, checks the sum.
* ``ddp_step``: one DistributedDataParallel step on a tiny model, checks the gradients agree.

The test suite's own programs (``check_env``, which checks every contract variable, and
``fail_once``) live in ``tests/programs``.
"""
