"""Schedules: a job's shape and policy, a seed for every delay, and faults with their times.

:func:`schedules` is the Hypothesis strategy the tests and the long run draw from; Hypothesis
shrinks a failing one to a minimal schedule (fewer faults, earlier, smaller values), which
``python -m tests.sim --replay '<json>'`` replays exactly.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: What a fault may be (sim.Sim.inject says what each does).
MEMBER_FAULTS = ("crash", "delete", "evict", "freeze", "partition")
SPARE_FAULTS = ("delete_spare", "crash_spare", "freeze_spare", "spares_crash")
OTHER_FAULTS = ("drain", "operator", "stranger")
KINDS = MEMBER_FAULTS + SPARE_FAULTS + OTHER_FAULTS


def _durations(longest: int = 600) -> st.SearchStrategy[float]:
    """A freeze's or a partition's length: shorter than the kernel's user timeout (connections
    survive it), around it, or well beyond (the node is judged lost), each often drawn."""
    return st.sampled_from([(20, 70), (70, 110), (110, longest)]).flatmap(
        lambda r: st.integers(*r).map(lambda x: x / 10.0))


@st.composite
def faults(draw: Any, pods: int, spares: int, extra: int) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 5))
    out = []
    kinds = MEMBER_FAULTS + (SPARE_FAULTS if spares else ()) + OTHER_FAULTS
    forever = extra  # nodes that may stay frozen without leaving the job short of nodes
    for _ in range(n):
        kind = draw(st.sampled_from(kinds))
        # When: mostly while the gang runs (it starts within ~3 s), sometimes as it starts.
        low, high = draw(st.sampled_from([(50, 600), (1, 50), (600, 1200)]))
        fault: dict[str, Any] = {"t": draw(st.integers(low, high)) / 10.0, "kind": kind}
        if kind in MEMBER_FAULTS or kind in SPARE_FAULTS:
            fault["target"] = draw(st.integers(0, pods - 1)) if kind in MEMBER_FAULTS else draw(st.integers(0, 3))
        if kind == "crash":
            fault["local"] = draw(st.integers(0, 3))
            fault["code"] = draw(st.sampled_from([1, 1, 2, 137]))
            if draw(st.integers(0, 9)) == 0:
                fault["permanent"] = True
        elif kind in ("freeze", "freeze_spare"):
            if forever > 0 and draw(st.booleans()):
                forever -= 1
            else:
                fault["duration"] = draw(_durations())
        elif kind == "partition":
            fault["duration"] = draw(_durations(300))
        elif kind == "operator":
            fault["duration"] = draw(st.integers(1, 200)) / 10.0
        elif kind == "spares_crash":
            fault["duration"] = draw(st.integers(10, 1200)) / 10.0
        elif kind == "stranger":
            fault["how"] = draw(st.sampled_from(["silent", "junk", "hello", "observer"]))
            fault["count"] = draw(st.sampled_from([1, 3, 70]))
        out.append(fault)
    return out


@st.composite
def schedules(draw: Any) -> dict[str, Any]:
    pods = draw(st.integers(2, 4))
    spares = draw(st.sampled_from([0, 0, 1, 2]))
    elastic = draw(st.integers(0, 3)) == 0
    extra = draw(st.integers(1, 2))
    s: dict[str, Any] = {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "pods": pods,
        "procs": draw(st.integers(1, 2)),
        "spares": spares,
        "min": draw(st.integers(1, pods - 1)) if elastic else None,
        "elastic_wait": draw(st.integers(1, 5)) if elastic else None,
        "max_restarts": draw(st.integers(0, 3)),
        "grace": draw(st.sampled_from([2, 5, 30])),
        "backoff": draw(st.sampled_from([1, 2, 5])),
        "train": float(draw(st.integers(30, 240))),
        "extra_nodes": extra,
        "capacity": draw(st.sampled_from([1, 1, 1, 2])),
        "stubborn": draw(st.sampled_from([0.0, 0.0, 0.3])),
    }
    s["faults"] = draw(faults(pods, spares, extra))
    return s
