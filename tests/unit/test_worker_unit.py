"""The worker's pure parts (monarch_spmd.worker): reading the MONARCH_SPMD_* inputs, the pod
local-rank scope, the child command, and the rule that the files shipped into pods import only
the standard library and the contract. Processes and sockets are in tests/lib/."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from monarch_spmd.payload import worker
from monarch_spmd.payload.worker import (
    WorkerInputError,
    build_env,
    command_for,
    read_inputs,
    worker_input_env,
)

PACKAGE = Path(worker.__file__).resolve().parents[1]

GOOD = {
    worker.MESH_VAR: "hosts=2,gpus=2",
    worker.COORDS_VAR: "1,0",
    worker.MASTER_ADDR_VAR: "hello-master.team-a.svc",
    worker.MASTER_PORT_VAR: "29500",
}


def test_required_inputs_and_defaults():
    inputs = read_inputs(GOOD)
    assert inputs.mesh == [("hosts", 2), ("gpus", 2)]
    assert inputs.coords == [1, 0] and inputs.rank == 2
    assert (inputs.master_addr, inputs.master_port) == ("hello-master.team-a.svc", 29500)
    assert (inputs.restart_count, inputs.max_restarts, inputs.run_id, inputs.role_name) == (0, 0, "none", "default")
    assert inputs.rendezvous_timeout == worker.DEFAULT_RENDEZVOUS_TIMEOUT
    assert inputs.local_rank_scope == worker.SCOPE_MESH


def test_every_input_is_read():
    env = {
        **GOOD,
        worker.RESTART_COUNT_VAR: "2",
        worker.MAX_RESTARTS_VAR: "3",
        worker.RUN_ID_VAR: "uid-1",
        worker.ROLE_NAME_VAR: "trainer",
        worker.RENDEZVOUS_TIMEOUT_VAR: "2.5",
        worker.LOCAL_RANK_SCOPE_VAR: "pod",
    }
    inputs = read_inputs(env)
    assert (inputs.restart_count, inputs.max_restarts, inputs.run_id, inputs.role_name) == (2, 3, "uid-1", "trainer")
    assert inputs.rendezvous_timeout == 2.5 and inputs.local_rank_scope == "pod"


def test_the_agent_token_is_read_checked_and_never_reaches_the_ranks():
    token = "A" * 20 + "-_" + "z" * 21
    inputs = read_inputs({**GOOD, worker.AGENT_TOKEN_VAR: token, worker.AGENT_PORT_VAR: "29400"})
    assert inputs.agent_token == token and token not in repr(inputs)
    assert worker.agent_settings(inputs, {}).token == token
    assert worker.AGENT_TOKEN_VAR not in worker.program_env({**GOOD, worker.AGENT_TOKEN_VAR: token, "HOME": "/"})
    assert read_inputs(GOOD).agent_token is None
    for bad in ("short", "has space in it 0123456789", "x" * 257, "quote'0123456789abcdef"):
        with pytest.raises(worker.WorkerInputError, match="MONARCH_SPMD_AGENT_TOKEN: not valid; expected 16..256"):
            read_inputs({**GOOD, worker.AGENT_TOKEN_VAR: bad})


def test_input_names_are_the_documented_ones():
    assert worker.INPUT_VARS == (
        "MONARCH_SPMD_MESH",
        "MONARCH_SPMD_COORDS",
        "MONARCH_SPMD_MASTER_ADDR",
        "MONARCH_SPMD_MASTER_PORT",
        "MONARCH_SPMD_RESTART_COUNT",
        "MONARCH_SPMD_MAX_RESTARTS",
        "MONARCH_SPMD_RUN_ID",
        "MONARCH_SPMD_ROLE_NAME",
        "MONARCH_SPMD_RENDEZVOUS_TIMEOUT",
        "MONARCH_SPMD_LOCAL_RANK_SCOPE",
        "MONARCH_SPMD_POD_LAYOUT",
        "MONARCH_SPMD_MODE",
        "MONARCH_SPMD_MONARCH_PORT",
        "MONARCH_SPMD_AGENT_PORT",
        "MONARCH_SPMD_AGENT_ADDR",
        "MONARCH_SPMD_AGENT_TOKEN",
        "MONARCH_SPMD_DISRUPTIONS",
        "MONARCH_SPMD_PERMANENT_EXIT_CODES",
        "MONARCH_SPMD_RETRYABLE_EXIT_CODES",
        "MONARCH_SPMD_PERMANENT_REASONS",
        "MONARCH_SPMD_BACKOFF_SECONDS",
        "MONARCH_SPMD_MAX_BACKOFF_SECONDS",
        "MONARCH_SPMD_BACKOFF_RESET_SECONDS",
        "MONARCH_SPMD_JOIN_TIMEOUT",
        "MONARCH_SPMD_MEMBER_FAILURE_LIMIT",
        "MONARCH_SPMD_MIN_MEMBERS",
        "MONARCH_SPMD_ELASTIC_WAIT",
        "MONARCH_SPMD_PROGRESS_TIMEOUT",
        "MONARCH_SPMD_STOP_GRACE",
        "MONARCH_SPMD_FAILURE_OUTPUT",
        "MONARCH_SPMD_LOG_DIR",
        "MONARCH_SPMD_REDIRECTS",
        "MONARCH_SPMD_TEE",
        "MONARCH_SPMD_AGENT_STORE",
    )
    for var in worker.INPUT_VARS:  # one table, in the module docstring, and in the design doc
        assert var in worker.__doc__
    doc = (PACKAGE.parent / "docs" / "restart-in-place.md").read_text()
    for var in worker.OPTIONAL_INPUTS.values():
        assert var in doc, var


@pytest.mark.parametrize(
    ("change", "var", "hint"),
    [
        ({worker.MESH_VAR: None}, worker.MESH_VAR, "not set"),
        ({worker.MESH_VAR: "hosts=0"}, worker.MESH_VAR, "at least 1"),
        ({worker.MESH_VAR: "Hosts=2"}, worker.MESH_VAR, "DNS label"),
        ({worker.COORDS_VAR: None}, worker.COORDS_VAR, "2 comma-separated coordinates"),
        ({worker.COORDS_VAR: "1,x"}, worker.COORDS_VAR, "integers"),
        ({worker.COORDS_VAR: "2,0"}, worker.COORDS_VAR, "0..1"),
        ({worker.COORDS_VAR: "1"}, worker.COORDS_VAR, "1 coordinates given"),
        ({worker.MASTER_ADDR_VAR: " "}, worker.MASTER_ADDR_VAR, "not set"),
        ({worker.MASTER_PORT_VAR: None}, worker.MASTER_PORT_VAR, "1..65535"),
        ({worker.MASTER_PORT_VAR: "0"}, worker.MASTER_PORT_VAR, "1..65535"),
        ({worker.MASTER_PORT_VAR: "70000"}, worker.MASTER_PORT_VAR, "1..65535"),
        ({worker.MASTER_PORT_VAR: "http"}, worker.MASTER_PORT_VAR, "1..65535"),
        ({worker.RESTART_COUNT_VAR: "-1"}, worker.RESTART_COUNT_VAR, "at least 0"),
        ({worker.MAX_RESTARTS_VAR: "many"}, worker.MAX_RESTARTS_VAR, "at least 0"),
        ({worker.RENDEZVOUS_TIMEOUT_VAR: "0"}, worker.RENDEZVOUS_TIMEOUT_VAR, "greater than 0"),
        ({worker.RENDEZVOUS_TIMEOUT_VAR: "soon"}, worker.RENDEZVOUS_TIMEOUT_VAR, "greater than 0"),
        ({worker.RENDEZVOUS_TIMEOUT_VAR: "inf"}, worker.RENDEZVOUS_TIMEOUT_VAR, "greater than 0"),
        ({worker.LOCAL_RANK_SCOPE_VAR: "node"}, worker.LOCAL_RANK_SCOPE_VAR, "mesh, pod"),
    ],
)
def test_bad_inputs_name_the_variable(change, var, hint):
    env = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(WorkerInputError) as err:
        read_inputs(env)
    assert str(err.value).startswith(var), err.value
    assert hint in str(err.value)


def test_mesh_scope_uses_the_last_dimension():
    env = build_env(read_inputs({**GOOD, worker.COORDS_VAR: "1,1"}), {})
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("3", "1", "2", "1")
    assert env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(("mesh", "coords"), [("hosts=2,gpus=2", "1,1"), ("a=2,b=2,c=1,d=2", "1,0,0,1")])
def test_pod_scope_makes_every_proc_its_own_node_with_rank_unchanged(mesh, coords):
    env_in = {**GOOD, worker.MESH_VAR: mesh, worker.COORDS_VAR: coords, worker.LOCAL_RANK_SCOPE_VAR: "pod"}
    mesh_env = build_env(read_inputs({**env_in, worker.LOCAL_RANK_SCOPE_VAR: "mesh"}), {})
    pod_env = build_env(read_inputs(env_in), {})
    assert pod_env["RANK"] == mesh_env["RANK"] and pod_env["WORLD_SIZE"] == mesh_env["WORLD_SIZE"]
    assert (pod_env["LOCAL_RANK"], pod_env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert (pod_env["GROUP_RANK"], pod_env["GROUP_WORLD_SIZE"]) == (pod_env["RANK"], pod_env["WORLD_SIZE"])
    assert "OMP_NUM_THREADS" not in pod_env


def test_inputs_reach_the_torchelastic_variables():
    env = build_env(
        read_inputs(
            {
                **GOOD,
                worker.RESTART_COUNT_VAR: "1",
                worker.MAX_RESTARTS_VAR: "4",
                worker.RUN_ID_VAR: "uid",
                worker.ROLE_NAME_VAR: "r",
            }
        ),
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
    )
    assert env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["TORCHELASTIC_MAX_RESTARTS"] == "4"
    assert env["TORCHELASTIC_RUN_ID"] == "uid" and env["ROLE_NAME"] == "r"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["MASTER_ADDR"] == "hello-master.team-a.svc" and env["MASTER_PORT"] == "29500"


def test_worker_input_env_round_trips():
    env = worker_input_env(
        [("hosts", 2), ("gpus", 2)],
        [1, 1],
        "m.svc",
        1234,
        restart_count=2,
        max_restarts=5,
        run_id="uid",
        role_name="trainer",
        rendezvous_timeout=30,
        local_rank_scope="pod",
    )
    # Every input but Monarch mode's own two and the optional ones, which are written only when given.
    assert set(env) == set(worker.INPUT_VARS) - {worker.MODE_VAR, worker.MONARCH_PORT_VAR} - set(worker.OPTIONAL_INPUTS.values())
    assert env[worker.RENDEZVOUS_TIMEOUT_VAR] == "30"
    inputs = read_inputs(env)
    assert (inputs.rank, inputs.master_port, inputs.restart_count, inputs.local_rank_scope) == (3, 1234, 2, "pod")


@pytest.mark.parametrize("given", [
    {},
    {"mode": "Monarch", "pod_layout": "PerHost", "monarch_port": 26600},
    {"mode": "Monarch", "pod_layout": "PerHost", "monarch_port": 26601},
    {"agent_port": 29400, "disruptions": 0, "backoff": 10.0, "max_backoff": 300.0, "backoff_reset": 300.0,
     "join_timeout": 120.0, "member_failure_limit": 3, "stop_grace": 30.0, "failure_output": "Tail"},
    {"agent_port": 29400, "disruptions": 2, "backoff": 0.5, "join_timeout": 7.0, "stop_grace": 1.0,
     "failure_output": "None", "role_name": "r", "rendezvous_timeout": 10, "local_rank_scope": "pod",
     "max_restarts": 4, "run_id": "uid", "redirects": "0:3", "tee": "2", "log_dir": "/l"},
])
def test_inputs_left_out_at_their_default_read_back_the_same(given):
    args = ([("hosts", 2), ("gpus", 2)], [1] if given.get("pod_layout") == "PerHost" else [1, 0], "m.svc", 1234)
    full = worker_input_env(*args, **given)
    lean = worker_input_env(*args, defaults=False, **given)
    assert read_inputs(lean) == read_inputs(full)
    assert set(lean) <= set(full)
    # The identity of the rank and its attempt are always written, default or not.
    assert {worker.MESH_VAR, worker.COORDS_VAR, worker.MASTER_ADDR_VAR, worker.MASTER_PORT_VAR,
            worker.RESTART_COUNT_VAR} <= set(lean)
    # Only variables at the default went, and each one that differs stayed.
    assert all(worker_input_env(*args, keep=[var], defaults=False, **given).get(var) == full[var] for var in full)
    left_out = set(full) - set(lean)
    for var in set(full) - left_out - {worker.MESH_VAR, worker.COORDS_VAR, worker.MASTER_ADDR_VAR,
                                       worker.MASTER_PORT_VAR, worker.RESTART_COUNT_VAR}:
        try:
            without = read_inputs({k: v for k, v in full.items() if k != var})
        except worker.WorkerInputError:
            continue  # needed: the rest does not even parse without it
        assert without != read_inputs(full), f"{var} is at its default"
    if given == {}:
        assert left_out == {worker.ROLE_NAME_VAR, worker.RENDEZVOUS_TIMEOUT_VAR, worker.LOCAL_RANK_SCOPE_VAR,
                            worker.POD_LAYOUT_VAR, worker.MAX_RESTARTS_VAR, worker.RUN_ID_VAR}


def test_the_restart_in_place_inputs_round_trip():
    env = worker_input_env(
        [("hosts", 2), ("gpus", 4)], [1], "m.svc", 1234, pod_layout="PerHost", max_restarts=3,
        agent_port=29400, disruptions=1, permanent_exit_codes=(3, 4), retryable_exit_codes=None,
        permanent_reasons=("OOMKilled",), backoff=2.5, max_backoff=60.0, backoff_reset=0.0, join_timeout=30.0,
        member_failure_limit=2, progress_timeout=90.0, stop_grace=5.0, log_dir="/l", redirects="0:3,1:1", tee="2")
    assert env[worker.AGENT_PORT_VAR] == "29400" and env[worker.PERMANENT_EXIT_CODES_VAR] == "3,4"
    assert worker.RETRYABLE_EXIT_CODES_VAR not in env  # None: not written
    inputs = read_inputs(env)
    assert (inputs.agent_port, inputs.agent_addr, inputs.disruptions, inputs.member, inputs.members) == (29400, None, 1, 1, 2)
    policy = inputs.policy()
    assert (policy.max_restarts, policy.disruptions, policy.permanent_exit_codes, policy.permanent_reasons) == (
        3, 1, (3, 4), ("OOMKilled",))
    assert (policy.backoff, policy.max_backoff, policy.backoff_reset, policy.join_timeout, policy.member_failure_limit) == (
        2.5, 60.0, 0.0, 30.0, 2)
    assert (inputs.progress_timeout, inputs.stop_grace, inputs.log_dir, inputs.redirects, inputs.tee) == (
        90.0, 5.0, "/l", {0: 3, 1: 1}, 2)
    settings = worker.agent_settings(inputs, {"NODE_NAME": "n1", "TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    assert settings.coordinator == ("m.svc", 29400) and settings.bind_any  # a pod: every interface
    assert (settings.member, settings.members, settings.procs, settings.first_rank, settings.node) == (1, 2, 4, 4, "n1")
    assert settings.watchdog and settings.prefix
    local = worker.agent_settings(read_inputs({**env, worker.AGENT_ADDR_VAR: "127.0.0.1"}), {})
    assert local.coordinator == ("127.0.0.1", 29400) and not local.bind_any and not local.watchdog
    alone = worker.agent_settings(read_inputs({k: v for k, v in env.items() if k != worker.AGENT_PORT_VAR}), {})
    assert alone.coordinator is None


def test_the_training_program_gets_no_worker_input():
    base = {**GOOD, "PATH": "/bin", "MONARCH_SPMD_ANYTHING": "x"}
    assert worker.program_env(base) == {"PATH": "/bin"}


@pytest.mark.parametrize(("var", "value", "hint"), [
    ("MONARCH_SPMD_AGENT_PORT", "0", "1..65535"),
    ("MONARCH_SPMD_AGENT_PORT", "29500", "rank 0's TCPStore"),
    ("MONARCH_SPMD_DISRUPTIONS", "-1", "at least 0"),
    ("MONARCH_SPMD_PERMANENT_EXIT_CODES", "3,x", "expected integers 1..255"),
    ("MONARCH_SPMD_RETRYABLE_EXIT_CODES", "256", "out of range"),
    ("MONARCH_SPMD_BACKOFF_SECONDS", "-1", "0 (off) or more"),
    ("MONARCH_SPMD_JOIN_TIMEOUT", "0", "greater than 0"),
    ("MONARCH_SPMD_MEMBER_FAILURE_LIMIT", "0", "at least 1"),
    ("MONARCH_SPMD_PROGRESS_TIMEOUT", "soon", "0 (off) or more"),
    ("MONARCH_SPMD_STOP_GRACE", "inf", "0 (off) or more"),
    ("MONARCH_SPMD_REDIRECTS", "4", "expected 0 (none)"),
    ("MONARCH_SPMD_TEE", "0:9", "expected 0 (none)"),
])
def test_bad_restart_in_place_inputs_name_the_variable(var, value, hint):
    with pytest.raises(WorkerInputError) as err:
        read_inputs({**GOOD, var: value})
    assert str(err.value).startswith(var) and hint in str(err.value), err.value


def test_worker_input_env_refuses_bad_values_naming_the_variable():
    with pytest.raises(WorkerInputError, match=rf"^{worker.COORDS_VAR}"):
        worker_input_env([("hosts", 2)], [2], "m", 1)
    with pytest.raises(WorkerInputError, match=rf"^{worker.MASTER_PORT_VAR}"):
        worker_input_env([("hosts", 2)], [0], "m", 0)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["--", "-m", "train", "--lr", "0.1"], ["PY", "-m", "train", "--lr", "0.1"]),
        (["-m", "train"], ["PY", "-m", "train"]),
        (["train.py", "-m", "x"], ["PY", "train.py", "-m", "x"]),
        (["--", "/opt/s.py"], ["PY", "/opt/s.py"]),
    ],
)
def test_command_for(argv, command):
    assert command_for(argv, python="PY") == command


@pytest.mark.parametrize("argv", [[], ["--"], ["-m"], ["--", "-m"], ["-m", ""], ["-c", "print(1)"]])
def test_command_for_refuses_bad_argv(argv):
    with pytest.raises(WorkerInputError, match=r"^argv:"):
        command_for(argv)


def _imports(path: Path) -> set[str]:
    """Top-level names of absolute imports; ``.module`` for relative ones."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.update({f".{node.module}"} if node.module else {f".{a.name}" for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module == "monarch_spmd":
            names.update(f".{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


PAYLOAD_FILES = sorted(p.name for p in (PACKAGE / "payload").glob("*.py"))


@pytest.mark.parametrize("name", PAYLOAD_FILES)
def test_payload_imports_only_the_standard_library_and_its_siblings(name):
    """The payload is shipped alone into pods: a relative import may name only a sibling module."""
    siblings = {f".{Path(n).stem}" for n in PAYLOAD_FILES}
    for imported in _imports(PACKAGE / "payload" / name):
        if imported.startswith("."):
            assert imported in siblings, f"payload/{name} imports {imported}"
        else:
            assert imported in sys.stdlib_module_names or imported == "__future__", f"payload/{name} imports {imported}"


def test_payload_holds_the_contract_the_worker_and_the_names():
    assert {"__init__.py", "contract.py", "names.py", "worker.py", "agent.py", "rendezvous.py", "timer.py",
            "failures.py", "procgroup.py"} <= set(PAYLOAD_FILES)


def test_init_imports_actor_only_inside_getattr():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:  # module level: no import of .actor
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.module == "payload.contract"


def test_a_per_host_worker_has_the_host_coordinates_and_runs_the_last_dimension():
    env = worker.worker_input_env([("hosts", 3), ("gpus", 4)], [2], "m", 1, pod_layout="PerHost")
    inputs = worker.read_inputs(env)
    assert (inputs.rank, inputs.local_procs, inputs.proc_coords(3)) == (8, 4, [2, 3])
    third = worker.build_env(inputs, {}, 2)
    assert (third["RANK"], third["LOCAL_RANK"], third["LOCAL_WORLD_SIZE"], third["GROUP_RANK"]) == ("10", "2", "4", "2")


def test_a_per_host_worker_of_a_one_dimension_mesh_has_no_coordinates():
    inputs = worker.read_inputs(worker.worker_input_env([("gpus", 2)], [], "m", 1, pod_layout="PerHost"))
    assert (inputs.coords, inputs.rank, inputs.local_procs) == ([], 0, 2)


@pytest.mark.parametrize(("coords", "layout"), [("1", "PerProc"), ("1,0", "PerHost"), ("3", "PerHost")])
def test_coordinates_must_fit_the_layout(coords, layout):
    env = {"MONARCH_SPMD_MESH": "hosts=2,gpus=2", "MONARCH_SPMD_COORDS": coords, "MONARCH_SPMD_MASTER_ADDR": "m",
           "MONARCH_SPMD_MASTER_PORT": "1", "MONARCH_SPMD_POD_LAYOUT": layout}
    with pytest.raises(WorkerInputError, match="MONARCH_SPMD_COORDS"):
        worker.read_inputs(env)


def test_an_unknown_layout_is_named():
    with pytest.raises(WorkerInputError, match="MONARCH_SPMD_POD_LAYOUT: 'Sideways'"):
        worker.read_inputs({"MONARCH_SPMD_MESH": "a=1", "MONARCH_SPMD_COORDS": "0", "MONARCH_SPMD_MASTER_ADDR": "m",
                            "MONARCH_SPMD_MASTER_PORT": "1", "MONARCH_SPMD_POD_LAYOUT": "Sideways"})


def test_the_agent_store_input_reaches_the_contract_and_only_member_0_hosts_the_store():
    off = read_inputs(GOOD)
    assert not off.agent_store and worker.build_env(off, {})["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert worker.agent_settings(off, {}).store is None
    for raw in ("1", "true", "True"):
        assert read_inputs({**GOOD, worker.AGENT_STORE_VAR: raw}).agent_store
    for raw in ("0", "false", " "):
        assert not read_inputs({**GOOD, worker.AGENT_STORE_VAR: raw}).agent_store
    with pytest.raises(worker.WorkerInputError, match="MONARCH_SPMD_AGENT_STORE: 'yes' is not valid; expected 1"):
        read_inputs({**GOOD, worker.AGENT_STORE_VAR: "yes"})
    on = read_inputs({**GOOD, worker.AGENT_STORE_VAR: "1"})  # coords 1,0: member 2
    assert worker.build_env(on, {})["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert worker.agent_settings(on, {}).store is None  # rank 0's agent hosts it, not this one
    first = read_inputs({**GOOD, worker.AGENT_STORE_VAR: "1", worker.COORDS_VAR: "0,0"})
    assert worker.agent_settings(first, {}).store == ("hello-master.team-a.svc", 29500)
    env = worker.worker_input_env([("hosts", 2), ("gpus", 2)], [0, 0], "m", 29500, agent_store=True)
    assert env[worker.AGENT_STORE_VAR] == "1" and read_inputs(env).agent_store
    assert worker.AGENT_STORE_VAR not in worker.worker_input_env([("hosts", 2)], [0], "m", 29500, agent_store=None)
    assert worker.AGENT_STORE_VAR not in worker.program_env({**env, "HOME": "/"})
