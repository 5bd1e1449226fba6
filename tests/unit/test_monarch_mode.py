"""Monarch mode's pure parts: the spec rules of spec.mode and the worker's Monarch inputs.

The pods of a Monarch-mode job serve Monarch's worker loop (operator side: test_builders.py and
lifecycle/test_monarch_mode.py; on a real cluster with real Monarch: tests/e2e/test_monarch_mode.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from monarch_spmd import schema, spec
from monarch_spmd.payload import worker
from monarch_spmd.spec import SpecError, check_manifest, parse_job_spec

MESH = [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}]


def monarch(**changes):
    raw = {"mesh": MESH, "image": "img", "mode": "Monarch", "podLayout": "PerHost"}
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def test_a_monarch_spec_has_no_args_and_program_is_the_default():
    s = parse_job_spec(monarch(), require_image=True)
    assert (s.mode, s.args, s.pod_layout) == ("Monarch", (), "PerHost")
    assert parse_job_spec({"mesh": MESH, "args": ["x.py"]}).mode == "Program"


@pytest.mark.parametrize(
    ("raw", "field", "hint"),
    [
        (monarch(args=["-m", "train"]), "spec.args", "not allowed with mode Monarch"),
        (monarch(args=[]), "spec.args", "not allowed with mode Monarch"),
        (monarch(podLayout=None), "spec.podLayout", "'PerProc' is not allowed; mode Monarch needs podLayout PerHost"),
        ({"mesh": MESH, "image": "img"}, "spec.args", "required; give the training argv"),
        ({"mesh": MESH, "image": "img", "mode": "Program", "podLayout": "PerHost"}, "spec.args", "required"),
        (monarch(mode="monarch"), "spec.mode", "expected one of Program, Monarch"),
    ],
)
def test_mode_rules_name_the_field(raw, field, hint):
    _, errors = spec.check_job_spec(raw, require_image=True)
    assert errors, raw
    assert any(e.field == field and hint in str(e) for e in errors), [str(e) for e in errors]


def test_the_rules_are_cel_on_spec_with_the_fields_they_name():
    rules = {r.field_path: r.cel() for r in spec.SPEC.rules if not r.transition}
    assert rules[".args"] == "(has(self.mode) && self.mode == 'Monarch') ? !has(self.args) : has(self.args)"
    assert rules[".podLayout"] == ("!(has(self.mode) && self.mode == 'Monarch') || "
                                   "(has(self.podLayout) && self.podLayout == 'PerHost')")


def test_mode_is_immutable():
    doc = {"apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": {"name": "m"}, "spec": monarch()}
    old = check_manifest(doc)[0]
    program = {**doc, "spec": {"mesh": MESH, "image": "img", "args": ["x.py"], "podLayout": "PerHost", "suspend": True}}
    _, errors = check_manifest(program, old=old)
    assert [e.field for e in errors] == ["spec.mode"] and "immutable" in str(errors[0])


def test_the_mode_is_one_entry_of_the_table():
    node = spec.SPEC.properties["mode"]
    assert isinstance(node, schema.Str)
    assert (node.enum, node.default) == (("Program", "Monarch"), "Program")
    for needed in ("torchmonarch", "PerHost", "26600", "readiness probe", "proc_mesh", "never succeeds"):
        assert needed in node.description


# --- the worker in Monarch mode -------------------------------------------------------------------

def monarch_inputs(**kw):
    return worker.worker_input_env([("hosts", 2), ("gpus", 2)], [1], "m.ns.svc", 29500, pod_layout="PerHost",
                                   mode="Monarch", **kw)


def test_monarch_inputs_round_trip_and_default_the_port():
    env = monarch_inputs(monarch_port=4444)
    assert (env["MONARCH_SPMD_MODE"], env["MONARCH_SPMD_MONARCH_PORT"]) == ("Monarch", "4444")
    inputs = worker.read_inputs(env)
    assert (inputs.mode, inputs.monarch_port, inputs.rank, inputs.local_procs) == ("Monarch", 4444, 2, 2)
    del env["MONARCH_SPMD_MONARCH_PORT"]
    assert worker.read_inputs(env).monarch_port == 26600
    program = worker.worker_input_env([("a", 2)], [0], "m", 1)
    assert "MONARCH_SPMD_MODE" not in program and worker.read_inputs(program).mode == "Program"


@pytest.mark.parametrize(
    ("change", "var", "hint"),
    [
        ({"MONARCH_SPMD_MODE": "Actors"}, "MONARCH_SPMD_MODE", "expected one of Program, Monarch"),
        ({"MONARCH_SPMD_POD_LAYOUT": "PerProc", "MONARCH_SPMD_COORDS": "1,0"}, "MONARCH_SPMD_MODE", "needs MONARCH_SPMD_POD_LAYOUT=PerHost"),
        ({"MONARCH_SPMD_MONARCH_PORT": "0"}, "MONARCH_SPMD_MONARCH_PORT", "1..65535"),
    ],
)
def test_bad_monarch_inputs_name_the_variable(change, var, hint):
    with pytest.raises(worker.WorkerInputError, match=var) as info:
        worker.read_inputs({**monarch_inputs(), **change})
    assert hint in str(info.value)


def test_a_monarch_worker_takes_no_argv(capsys):
    assert worker.main(["--", "-m", "train"], environ=monarch_inputs()) == worker.EX_USAGE
    assert "takes no argv" in capsys.readouterr().err


def test_the_loop_advertises_the_pod_ip_and_binds_every_interface():
    assert worker.monarch_address({"POD_IP": "10.244.0.7"}, 26600) == "tcp://10.244.0.7:26600@tcp://0.0.0.0:26600"
    assert worker.monarch_address({"POD_IP": "fd00::7"}, 26600) == "tcp://[fd00::7]:26600@tcp://[::]:26600"
    assert worker.monarch_address({}, 1).startswith("tcp://")


def test_the_bootstrap_without_monarch_exits_64_naming_what_to_install():
    # -S: no site-packages, so no torchmonarch: what an image without it does.
    done = subprocess.run([sys.executable, "-S", "-c", worker.MONARCH_BOOTSTRAP, "tcp://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == worker.EX_USAGE
    assert "mode Monarch needs torchmonarch in the image" in done.stderr
    assert "pip install torchmonarch" in done.stderr
