"""monarch_spmd.replicas' pure parts: the flags' checks, the failure rule, each group's command
and environment, and the CLI's removal of the replica-group flags from a group's arguments."""

from __future__ import annotations

import pytest

from monarch_spmd import cli, replicas
from monarch_spmd.replicas import DONE, GO_ON, STOP, Options, ReplicaGroupsError, check, decide, exit_code


@pytest.mark.parametrize(("opts", "message"), [
    (Options(0), "--replica-groups: 0 is out of range; valid is 1 or more"),
    (Options(3, min_replicas=4), "--min-replicas: 4 is out of range; valid is 1..3"),
    (Options(3, min_replicas=0), "--min-replicas: 0 is out of range; valid is 1..3"),
    (Options(2, lighthouse_port=70000), "--lighthouse-port: 70000 is out of range; valid is 1..65535"),
    (Options(3, master_port=65534), "--master-port: 65534 + 2 (the last group's) is above 65535"),
    (Options(3, master_port=29600, lighthouse_port=29601), "--lighthouse-port: 29601 is a group's master port"),
])
def test_bad_flags_are_refused_naming_the_flag_and_the_range(opts, message):
    with pytest.raises(ReplicaGroupsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        check(opts)


def test_good_flags_pass_and_min_replicas_defaults_to_one():
    assert check(Options(3)) == Options(3, 1)
    assert check(Options(3, 3, 29510, 29600)).min_replicas == 3


@pytest.mark.parametrize(("codes", "m", "now", "code"), [
    ([None, None, None], 1, GO_ON, None),
    ([None, 1, None], 1, GO_ON, None),  # one failed for good, two go on
    ([0, 1, 0], 1, DONE, 0),  # every group ended, 2 >= 1 finished
    ([0, 1, 0], 2, DONE, 0),
    ([None, 1, None], 3, STOP, 1),  # min-replicas = groups: any failure stops the run
    ([None, 7, 1], 2, STOP, 7),  # the code of the group whose failure left too few
    ([1, 1, 0], 1, DONE, 0),
    ([0, 0, 0], 3, DONE, 0),
])
def test_the_rule(codes, m, now, code):
    assert decide(codes, m) == now
    if code is not None:
        last = next((g for g, c in enumerate(codes) if c), None)
        assert exit_code(codes, m, last) == code


def test_each_group_has_its_own_port_and_torchfts_variables():
    assert replicas.master_ports(Options(3, master_port=29600)) == [29600, 29601, 29602]
    picks = iter([5000, 5000, 29510, 5001, 5002])
    assert replicas.master_ports(Options(3, lighthouse_port=29510), pick=lambda: next(picks)) == [5000, 5001, 5002]
    env = replicas.group_env({"HOME": "/h"}, 1, 3, 29510)
    assert env == {"HOME": "/h", "REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "3",
                   "TORCHFT_LIGHTHOUSE": "http://127.0.0.1:29510", "TORCHFT_QUORUM_RETRIES": "10"}
    assert replicas.group_env({"TORCHFT_QUORUM_RETRIES": "2"}, 0, 1, 1)["TORCHFT_QUORUM_RETRIES"] == "2"
    cmd = replicas.group_command(["--nproc-per-node", "2", "train.py"], 29601, python="py")
    assert cmd == ["py", "-m", "monarch_spmd", "run", "--agent-store", "--master-port", "29601", "--nproc-per-node", "2",
                   "train.py"]
    assert replicas.lighthouse_command("lh", 29510, 2) == ["lh", "--min_replicas", "2", "--bind", "127.0.0.1:29510"]


def test_a_missing_lighthouse_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ReplicaGroupsError, match=r"pip install 'monarch-spmd\[torchft\]'"):
        replicas.find_lighthouse(str(tmp_path / "python"))


def test_a_group_runner_gets_the_job_arguments_without_the_replica_group_flags():
    p = cli._run_parser()
    drop = [*cli._GROUP_FLAGS, "--master-port", "--master_port"]
    assert cli._without(["--replica-groups", "3", "--min-replicas=2", "--nproc-per-node", "2", "--master-port", "29600",
                         "t.py", "--replica-groups", "x"], p, drop) == ["--nproc-per-node", "2", "t.py",
                                                                         "--replica-groups", "x"]
    assert cli._without(["--replica-groups", "3", "--mesh", "a=2", "--", "-m", "t", "--master-port", "1"], p, drop) == [
        "--mesh", "a=2", "--", "-m", "t", "--master-port", "1"]


def test_the_flags_are_checked_before_anything_starts(capsys):
    assert cli.main(["run", "--replica-groups", "3", "--min-replicas", "4", "--nproc-per-node", "2", "t.py"]) == 2
    assert "--min-replicas: 4 is out of range; valid is 1..3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--lighthouse-port", "29510", "--nproc-per-node", "2", "t.py"])
    assert e.value.code == 2 and "--lighthouse-port goes with --replica-groups G" in capsys.readouterr().err
