"""SPMDActor and setup_torch_elastic_env on real Monarch proc meshes (torchmonarch, CPU, gloo).

A {hosts: 2, gpus: 2} mesh is built on this one host with
``this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})``: Monarch 0.7.0 takes any ordered
dict of dimensions there, and ``current_rank()`` in each proc reports the labels, sizes and
row-major rank of that mesh.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket

import pytest

from monarch.actor import ActorError, this_host

from monarch_spmd import SPMDActor, SPMDScriptExit, setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch_spmd.actor import reachable_address
from monarch_spmd.examples import allreduce

from .conftest import script
from .spmd_actors import Probe

pytestmark = pytest.mark.monarch

MESH = {"hosts": 2, "gpus": 2}


@pytest.fixture(scope="module")
def proc_mesh():
    mesh = this_host().spawn_procs(per_host=MESH)
    yield mesh
    mesh.stop().get()


def values(value_mesh) -> list:
    return [v for _, v in value_mesh.items()]


def by_coords(value_mesh) -> dict[tuple[int, int], object]:
    return {(p["hosts"], p["gpus"]): v for p, v in value_mesh.items()}


def master(actors, proc_mesh, use_ipaddr=None):
    # The first API example, verbatim but for the import path.
    first_values = dict.fromkeys(proc_mesh._labels, 0)
    return actors.slice(**first_values).get_host_port.call_one(use_ipaddr).get()


def test_setup_env_gives_every_proc_the_torchrun_table(proc_mesh):
    assert setup_torch_elastic_env(proc_mesh) is None
    envs = by_coords(proc_mesh.spawn("probe", Probe).contract_env.call().get())
    assert set(envs) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs.values()}
    assert len(masters) == 1
    (addr, port), = masters
    ipaddress.ip_address(addr)  # an IP, not a bare host name that may resolve only locally
    assert addr == reachable_address(None)
    assert 1 <= int(port) <= 65535
    for (h, g), e in envs.items():
        rank = 2 * h + g
        assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == (str(rank), "4", str(g), "2")
        assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_RANK"], e["ROLE_WORLD_SIZE"]) == (str(h), "2", str(rank), "4")
        assert e["ROLE_NAME"] == "default"
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
        assert e["TORCHELASTIC_RUN_ID"] and e["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert "OMP_NUM_THREADS" in e


def test_gloo_allreduce_and_a_ddp_step_after_setup_torch_elastic_env(proc_mesh):
    setup_torch_elastic_env(proc_mesh)
    probes = proc_mesh.spawn("probe", Probe)
    assert values(probes.allreduce.call().get()) == [10.0] * 4
    setup_torch_elastic_env(proc_mesh)  # a fresh port for the next group
    assert values(probes.ddp_step.call().get()) == [0] * 4


def test_explicit_master_address_and_port_are_used(proc_mesh):
    port = 20000 + os.getpid() % 20000
    setup_torch_elastic_env(proc_mesh, "127.0.0.1", port)
    envs = values(proc_mesh.spawn("probe", Probe).contract_env.call().get())
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", str(port))}


def test_the_first_api_example_with_a_module(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    master_addr, master_port = master(spmd_actors, proc_mesh)
    result = spmd_actors.main.call(master_addr, master_port, ["-m", "monarch_spmd.examples.allreduce"]).get()
    assert values(result) == [True] * 4


def test_the_first_api_example_with_a_script_path(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    master_addr, master_port = master(spmd_actors, proc_mesh)
    result = spmd_actors.main.call(master_addr, master_port, [allreduce.__file__, "--timeout", "60"]).get()
    assert values(result) == [True] * 4


def test_a_ddp_step_through_main(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    master_addr, master_port = master(spmd_actors, proc_mesh)
    assert values(spmd_actors.main.call(master_addr, master_port, ["-m", "monarch_spmd.examples.ddp_step"]).get()) == [True] * 4


def test_sys_exit_zero_is_success_and_a_failure_code_is_an_error_that_spares_the_actor(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    addr, port = master(spmd_actors, proc_mesh)
    assert values(spmd_actors.main.call(addr, port, [script("exit_with.py"), "0"]).get()) == [True] * 4
    with pytest.raises(ActorError) as err:
        spmd_actors.main.call(addr, port, [script("exit_with.py"), "3"]).get()
    assert isinstance(err.value.exception, SPMDScriptExit)
    assert err.value.exception.code == 3
    assert "exited with code 3" in str(err.value.exception)
    # The actors are alive and serve the next call.
    assert values(spmd_actors.main.call(addr, port, [script("exit_with.py"), "0"]).get()) == [True] * 4


def test_sys_exit_with_a_message_counts_as_code_1(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    addr, port = master(spmd_actors, proc_mesh)
    with pytest.raises(ActorError) as err:
        spmd_actors.main.call(addr, port, [script("exit_with.py"), "bad config"]).get()
    assert err.value.exception.code == 1 and "bad config" in str(err.value.exception)


def test_argv_path_and_environ_are_restored_after_main(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    probes = proc_mesh.spawn("probe", Probe)
    addr, port = master(spmd_actors, proc_mesh)
    before = by_coords(probes.state.call().get())
    # mutate_state.py imports a module beside it, changes env/argv/path, then exits 0 or 5.
    assert values(spmd_actors.main.call(addr, port, [script("mutate_state.py")]).get()) == [True] * 4
    assert by_coords(probes.state.call().get()) == before
    with pytest.raises(ActorError) as err:
        spmd_actors.main.call(addr, port, [script("mutate_state.py"), "5"]).get()
    assert err.value.exception.code == 5
    assert by_coords(probes.state.call().get()) == before
    argv, environ, _ = next(iter(before.values()))
    assert "MONARCH_SPMD_TEST_LEAK" not in environ and "--mutated" not in argv


@pytest.mark.parametrize("script_args", [["-m"], []])
def test_dash_m_alone_or_nothing_is_a_value_error(proc_mesh, script_args):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    with pytest.raises(ActorError) as err:
        spmd_actors.main.call("127.0.0.1", 29500, script_args).get()
    assert isinstance(err.value.exception, ValueError)
    assert str(err.value.exception).startswith("script_args:")


@pytest.mark.parametrize(
    ("addr", "port", "field"),
    [("127.0.0.1", None, "master_addr, master_port"), (None, 29500, "master_addr, master_port"), ("127.0.0.1", 0, "master_port")],
)
def test_master_address_and_port_come_both_or_neither(proc_mesh, addr, port, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        setup_torch_elastic_env(proc_mesh, addr, port)


def test_get_host_port_honours_the_address_family(proc_mesh):
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    v4, port4 = master(spmd_actors, proc_mesh, socket.AF_INET)
    assert ipaddress.ip_address(v4).version == 4
    v6, port6 = master(spmd_actors, proc_mesh, socket.AF_INET6)
    assert ipaddress.ip_address(v6).version == 6
    for addr, port in ((v4, port4), (v6, port6)):  # the port is free on that address
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((addr, port))


def test_get_host_port_accepts_monarchs_addr_type(proc_mesh):
    from monarch.tools.network import AddrType

    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    addr, _ = master(spmd_actors, proc_mesh, AddrType.IPv4)
    assert ipaddress.ip_address(addr).version == 4


def test_the_async_twin(proc_mesh):
    assert asyncio.run(setup_torch_elastic_env_async(proc_mesh)) is None
    envs = values(proc_mesh.spawn("probe", Probe).contract_env.call().get())
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1, 2, 3]


def test_the_second_api_example_on_a_one_dimensional_mesh():
    proc_mesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        setup_torch_elastic_env(proc_mesh)
        probes = proc_mesh.spawn("probe", Probe)
        envs = values(probes.contract_env.call().get())
        assert sorted((e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs) == [("0", "0", "0"), ("1", "1", "0")]
        assert values(probes.allreduce.call().get()) == [3.0, 3.0]
    finally:
        proc_mesh.stop().get()


def test_a_mesh_without_dimensions_is_one_proc():
    proc_mesh = this_host().spawn_procs()
    try:
        setup_torch_elastic_env(proc_mesh)
        env = proc_mesh.spawn("probe", Probe).contract_env.call_one().get()
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1", "0", "1")
    finally:
        proc_mesh.stop().get()
