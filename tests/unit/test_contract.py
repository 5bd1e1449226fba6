"""The env contract (monarch_spmd.contract): torchrun's worker table on many mesh shapes, and
every bad input refused with a ValueError that names the field and the valid range."""

from __future__ import annotations

import itertools
import math

import pytest

from monarch_spmd.payload import contract
from monarch_spmd.payload.contract import (
    coords_of,
    format_mesh,
    parse_mesh,
    rank_of,
    torch_elastic_env,
    validate_mesh,
    world_size,
)

TORCHRUN_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}

SHAPES = [
    [("procs", 1)],
    [("procs", 5)],
    [("hosts", 2), ("gpus", 2)],
    [("hosts", 3), ("gpus", 4)],
    [("hosts", 4), ("gpus", 1)],
    [("hosts", 1), ("gpus", 8)],
    [("zone", 2), ("hosts", 3), ("gpus", 2)],
    [("a", 2), ("b", 1), ("c", 3), ("d", 2)],
]


def all_coords(mesh):
    return itertools.product(*(range(size) for _, size in mesh))


@pytest.mark.parametrize("mesh", SHAPES, ids=format_mesh)
def test_every_proc_of_a_mesh_gets_the_torchrun_table(mesh):
    world = math.prod(size for _, size in mesh)
    local_world = mesh[-1][1]
    ranks = []
    for coords in all_coords(mesh):
        env = torch_elastic_env(mesh, coords, "10.0.0.1", 29500, restart_count=1, max_restarts=3, run_id="job-uid")
        rank = int(env["RANK"])
        ranks.append(rank)
        assert TORCHRUN_VARS <= set(env)
        assert all(isinstance(v, str) for v in env.values())
        assert env["WORLD_SIZE"] == str(world)
        assert env["LOCAL_RANK"] == str(coords[-1])
        assert env["LOCAL_WORLD_SIZE"] == str(local_world)
        assert env["GROUP_RANK"] == str(rank // local_world)
        assert env["GROUP_WORLD_SIZE"] == str(world // local_world)
        assert env["ROLE_RANK"] == env["RANK"] and env["ROLE_WORLD_SIZE"] == env["WORLD_SIZE"]
        assert env["ROLE_NAME"] == "default"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
        assert env["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert env["TORCHELASTIC_RUN_ID"] == "job-uid"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        # rank is the row-major index: the procs of one "host" (all but the last coordinate) are
        # contiguous, and LOCAL_RANK runs fastest.
        assert rank == rank % local_world + local_world * (rank // local_world)
        assert rank % local_world == coords[-1]
    # row-major order: itertools.product enumerates coordinates in exactly that order
    assert ranks == list(range(world))


def test_a_2x4_mesh_matches_torchrun_on_two_nodes_of_four():
    # torchrun --nnodes 2 --nproc-per-node 4: node 1, local rank 2 is global rank 6.
    env = torch_elastic_env([("hosts", 2), ("gpus", 4)], [1, 2], "m", 1234)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "6",
        "LOCAL_RANK": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "4",
    }


def test_defaults_are_torchruns():
    env = torch_elastic_env([("procs", 1)], [0], "localhost", 29500)
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
    assert env["TORCHELASTIC_RUN_ID"] == "none"
    assert env["ROLE_NAME"] == contract.DEFAULT_ROLE_NAME == "default"


def test_role_name_is_passed_through():
    assert torch_elastic_env([("p", 2)], [1], "m", 1, role_name="trainer")["ROLE_NAME"] == "trainer"


def test_omp_num_threads_is_one_when_procs_share_a_host_and_the_user_did_not_set_it():
    assert torch_elastic_env([("hosts", 2), ("gpus", 2)], [0, 1], "m", 1)["OMP_NUM_THREADS"] == "1"


def test_omp_num_threads_is_left_unset_for_one_proc_per_host():
    assert "OMP_NUM_THREADS" not in torch_elastic_env([("hosts", 4), ("gpus", 1)], [2, 0], "m", 1)


def test_the_users_omp_num_threads_and_nccl_setting_win():
    base = {"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    env = torch_elastic_env([("hosts", 1), ("gpus", 4)], [0, 3], "m", 1, base_env=base)
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_the_result_holds_only_contract_variables_and_does_not_touch_base_env():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "2"}
    env = torch_elastic_env([("g", 2)], [1], "m", 1, base_env=base)
    assert set(env) == TORCHRUN_VARS | {"OMP_NUM_THREADS"}
    assert base == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}


def test_ipv6_master_address_is_kept_verbatim():
    assert torch_elastic_env([("g", 1)], [0], "fd00::2", 65535)["MASTER_ADDR"] == "fd00::2"


@pytest.mark.parametrize("mesh", SHAPES, ids=format_mesh)
def test_rank_of_and_coords_of_are_inverse(mesh):
    for rank in range(world_size(mesh)):
        assert rank_of(mesh, coords_of(mesh, rank)) == rank


@pytest.mark.parametrize("mesh", SHAPES, ids=format_mesh)
def test_parse_and_format_mesh_round_trip(mesh):
    assert parse_mesh(format_mesh(mesh)) == mesh


def test_parse_mesh_accepts_spaces():
    assert parse_mesh(" hosts = 2 , gpus=4") == [("hosts", 2), ("gpus", 4)]


def test_validate_mesh_accepts_tuples_and_lists_and_returns_pairs():
    assert validate_mesh((["hosts", 2], ("gpus", 3))) == [("hosts", 2), ("gpus", 3)]


def test_limits_are_reachable():
    biggest = [("a", 8), ("b", 8), ("c", 8), ("d", 8)]
    assert world_size(validate_mesh(biggest)) == contract.MAX_PROCS == 4096
    env = torch_elastic_env(biggest, [7, 7, 7, 7], "m", 1)
    assert env["RANK"] == "4095" and env["GROUP_WORLD_SIZE"] == "512"


# --- errors: ValueError naming the field and what is valid -------------------------------------


@pytest.mark.parametrize(
    ("mesh", "field", "hint"),
    [
        ([], "mesh", "at least one dimension"),
        ([("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)], "mesh", "at most 4"),
        ([("hosts", 0)], "mesh[0].size", "at least 1"),
        ([("hosts", 2), ("gpus", -1)], "mesh[1].size", "at least 1"),
        ([("hosts", 2.5)], "mesh[0].size", "integer"),
        ([("hosts", True)], "mesh[0].size", "integer"),
        ([("hosts", "2")], "mesh[0].size", "integer"),
        ([("hosts", 2), ("hosts", 2)], "mesh[1].name", "unique"),
        ([("Hosts", 2)], "mesh[0].name", "DNS label"),
        ([("gpus_per_host", 2)], "mesh[0].name", "DNS label"),
        ([("1st", 2)], "mesh[0].name", "DNS label"),
        ([("", 2)], "mesh[0].name", "DNS label"),
        ([("x" * 64, 2)], "mesh[0].name", "63 characters"),
        ([(7, 2)], "mesh[0].name", "DNS label"),
        ([("hosts", 2, 3)], "mesh[0]", "(name, size) pair"),
        ([("a", 64), ("b", 65)], "mesh", "at most 4096"),
    ],
)
def test_bad_meshes_name_the_field(mesh, field, hint):
    with pytest.raises(ValueError) as err:
        validate_mesh(mesh)
    message = str(err.value)
    assert message.startswith(f"{field}:"), message
    assert hint in message


@pytest.mark.parametrize(
    ("text", "field"),
    [("hosts", "mesh[0]"), ("hosts=2,gpus", "mesh[1]"), ("hosts=two", "mesh[0]"), ("hosts=0", "mesh[0].size"), ("", "mesh[0]")],
)
def test_bad_mesh_strings_name_the_part(text, field):
    with pytest.raises(ValueError) as err:
        parse_mesh(text)
    assert str(err.value).startswith(f"{field}:"), err.value


@pytest.mark.parametrize(
    ("coords", "field", "valid"),
    [
        ([2, 0], "coords.hosts", "0..1"),
        ([0, 4], "coords.gpus", "0..3"),
        ([-1, 0], "coords.hosts", "0..1"),
        ([0, True], "coords.gpus", "0..3"),
        ([0, 1.0], "coords.gpus", "0..3"),
    ],
)
def test_coordinates_out_of_range_name_the_dimension_and_range(coords, field, valid):
    with pytest.raises(ValueError) as err:
        torch_elastic_env([("hosts", 2), ("gpus", 4)], coords, "m", 1)
    assert str(err.value).startswith(f"{field}:") and valid in str(err.value)


def test_wrong_number_of_coordinates_names_coords():
    with pytest.raises(ValueError, match=r"^coords: 1 coordinates given for a mesh of 2 dimensions"):
        torch_elastic_env([("hosts", 2), ("gpus", 4)], [0], "m", 1)


@pytest.mark.parametrize("port", [0, -1, 65536, "29500", None, True, 29500.0])
def test_bad_ports_name_master_port_and_range(port):
    with pytest.raises(ValueError, match=r"^master_port: .* valid is 1\.\.65535"):
        torch_elastic_env([("p", 1)], [0], "m", port)


@pytest.mark.parametrize("addr", ["", "   ", None, 5])
def test_bad_master_addresses_name_master_addr(addr):
    with pytest.raises(ValueError, match=r"^master_addr:"):
        torch_elastic_env([("p", 1)], [0], addr, 1)


@pytest.mark.parametrize("field", ["restart_count", "max_restarts"])
@pytest.mark.parametrize("value", [-1, "1", True, 1.5])
def test_bad_restart_numbers_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: .* at least 0"):
        torch_elastic_env([("p", 1)], [0], "m", 1, **{field: value})


def test_empty_role_name_is_refused():
    with pytest.raises(ValueError, match=r"^role_name:"):
        torch_elastic_env([("p", 1)], [0], "m", 1, role_name="")


@pytest.mark.parametrize("rank", [-1, 4, True, "1"])
def test_coords_of_refuses_ranks_out_of_range(rank):
    with pytest.raises(ValueError, match=r"^rank: .* valid is 0\.\.3"):
        coords_of([("hosts", 2), ("gpus", 2)], rank)


def test_the_agent_store_is_said_only_when_the_agent_hosts_it():
    mesh, coords = [("nodes", 1), ("procs", 2)], [0, 1]
    assert torch_elastic_env(mesh, coords, "m", 29500)["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    on = torch_elastic_env(mesh, coords, "m", 29500, use_agent_store=True)
    assert on["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # torch compares with str(True)
    off = torch_elastic_env(mesh, coords, "m", 29500)
    assert {k: v for k, v in on.items() if k != "TORCHELASTIC_USE_AGENT_STORE"} == {
        k: v for k, v in off.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
