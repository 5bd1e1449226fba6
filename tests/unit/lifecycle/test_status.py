"""The status side of a pass (lifecycle.status): conditions, merge patches, generations."""

from __future__ import annotations

import datetime as dt

from spmd_operator import lifecycle

from .helpers import NOW, cond, gang, run, status


def test_observed_generation_follows_the_spec_on_the_job_and_every_condition():
    st = status("Running", observedGeneration=1)
    st["conditions"] = [{**c, "observedGeneration": 1} for c in st["conditions"]]
    patch = run(st=st, pods=gang("Running"), generation=2).status
    assert patch["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 for c in patch["conditions"])


def test_condition_transition_time_moves_only_on_a_status_change():
    later = NOW + dt.timedelta(minutes=5)
    conds = lifecycle.set_condition([], "Running", "False", "WaitingForProcs", "1/4", NOW)
    conds = lifecycle.set_condition(conds, "Running", "False", "WaitingForProcs", "3/4", later)
    assert conds[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert conds[0]["message"] == "3/4"
    conds = lifecycle.set_condition(conds, "Running", "True", "AllProcsRunning", "4/4", later)
    assert conds[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"


def test_conditions_are_listed_in_a_fixed_order():
    conds = lifecycle.set_condition([], "Failed", "True", "x", "y", NOW)
    conds = lifecycle.set_condition(conds, "Created", "True", "x", "y", NOW)
    assert [c["type"] for c in conds] == ["Created", "Failed"]
    assert cond({"conditions": conds}, "Failed")["status"] == "True"


def test_merge_patch():
    assert lifecycle.merge_patch({"a": 1, "b": {"x": 1, "y": 2}}, {"a": 1, "b": {"x": 1}}) == {"b": {"y": None}}
    assert lifecycle.merge_patch({"a": 1}, {"a": 1}) == {}
    assert lifecycle.merge_patch({"a": 1}, {}) == {"a": None}
    assert lifecycle.merge_patch({}, {"c": [1]}) == {"c": [1]}
