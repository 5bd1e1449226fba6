"""Elastic sizes with real workers, as pods run them (torchrun's --nnodes 2:3, nproc-per-node 2):
three PerHost workers started by hand with the inputs the operator gives an elastic job's pods,
real sockets to the coordinator in rank 0's worker, real gloo training that reshards from a
checkpoint (monarch_spmd.examples.elastic_train). A member's pod is lost (its worker's process
group SIGKILLed) and nothing replaces it: the next round runs with two. Its replacement comes
back: the gang grows to three again. maxRestarts is 0: neither change is a restart of the
program's. Every round's ranks get the variables torchrun's elastic agent gives after a
re-rendezvous (docs/design/torchrun-elastic.md)."""

from __future__ import annotations

import json
import os
import re
import signal

from monarch_spmd.payload import rendezvous

from .test_agent import Gang

WAIT = "2"


def starts(text: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"elastic_train start (\{.*\})", text)]


def torchrun_env(members: list[int], member: int, local: int, procs: int, restart: int) -> dict[str, str]:
    """What torchrun's agents give a rank after a rendezvous of ``members`` (sorted node order,
    dense group ranks, ranks by cumulative local sizes); the restart count is the gang's round."""
    group = sorted(members).index(member)
    world = len(members) * procs
    rank = group * procs + local
    return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(procs),
            "GROUP_RANK": str(group), "GROUP_WORLD_SIZE": str(len(members)), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "TORCHELASTIC_RESTART_COUNT": str(restart)}


def test_an_elastic_gang_shrinks_when_a_member_is_lost_and_grows_back_when_it_returns(spawn, tmp_path):
    gang = Gang(spawn, "nodes=3,procs=2", ["-m", "monarch_spmd.examples.elastic_train", "--checkpoint-dir",
                                           str(tmp_path), "--steps", "160", "--step-seconds", "0.05"],
                layout="PerHost", MONARCH_SPMD_MAX_RESTARTS="0", MONARCH_SPMD_MIN_MEMBERS="2",
                MONARCH_SPMD_ELASTIC_WAIT=WAIT)
    events = gang.observed()
    try:
        first = events.wait(rendezvous.EV_STARTED)
        assert (first["round"], first["round_members"], first["world_size"]) == (0, [0, 1, 2], 6)
        events.wait(rendezvous.EV_ALL_RUNNING)
        gang.workers[0].wait_for(r"elastic_train step \d+ world 6")  # trains at full size
        lost = gang.workers[2]
        os.killpg(lost.proc.pid, signal.SIGKILL)  # member 2's pod is lost; nothing replaces it
        restart = events.wait(rendezvous.EV_RESTART)
        assert (restart["reason"], restart["member"]) == ("MemberLost", 2)
        small = events.wait(rendezvous.EV_STARTED, round=1)
        assert (small["round_members"], small["world_size"]) == ([0, 1], 4), small
        resize = events.wait(rendezvous.EV_RESIZE, round=1)
        assert resize["message"] == "round 1 runs 2 of 3 members (at least 2): 0..1"
        back = events.wait(rendezvous.EV_ALL_RUNNING, round=1)
        print(f"from the loss to every rank of the smaller round running: {back['seconds_since_failure']:.2f}s "
              f"(elastic wait {WAIT}s)")
        gang.workers[0].wait_for(r"elastic_train step \d+ world 4")  # trains, smaller
        gang.start(2, MONARCH_SPMD_RESTART_COUNT="1")  # its pod is created again, as the operator does
        grow = events.wait(rendezvous.EV_RESIZE, member=2)
        assert (grow["size"], grow["next_size"]) == (2, 3)
        again = events.wait(rendezvous.EV_RESTART, count=2)
        assert (again["reason"], again["backoff_seconds"]) == (rendezvous.REASON_MEMBERSHIP, 0.0)
        full = events.wait(rendezvous.EV_STARTED, round=2)
        assert (full["round_members"], full["world_size"]) == ([0, 1, 2], 6)
        assert events.wait(rendezvous.EV_SUCCEEDED, timeout=240)
        codes = [w.finish(60) for w in gang.workers.values()]
        text = lost.text + "".join(w.text for w in gang.workers.values())
        assert codes == [0, 0, 0], text[-3000:]
        # Every round's ranks saw what torchrun's elastic agent gives after a re-rendezvous.
        rounds = {0: [0, 1, 2], 1: [0, 1], 2: [0, 1, 2]}
        seen = {}
        for line in starts(text):
            env = line["env"]
            r = int(env["TORCHELASTIC_RESTART_COUNT"])
            seen[(r, int(env["RANK"]))] = env
        for r, members in rounds.items():
            for member in members:
                for local in range(2):
                    want = torchrun_env(members, member, local, 2, r)
                    got = seen.get((r, int(want["RANK"])))
                    assert got is not None, f"no start of rank {want['RANK']} in round {r}: {sorted(seen)}"
                    assert {k: got[k] for k in want} == want
                    assert got["MASTER_ADDR"] == "127.0.0.1"
        assert sorted(seen) == sorted((r, rank) for r, ms in rounds.items() for rank in range(2 * len(ms)))
        done = re.search(r"elastic_train done at step 160: w matches a run at one fixed size \((.*)\)", text)
        assert done, text[-3000:]
        assert "4 ranks from step" in done.group(1) and done.group(1).count("6 ranks from step") == 2, done.group(1)
    finally:
        gang.stop_all()
        events.close()
