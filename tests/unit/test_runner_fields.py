"""Every field of the SPMDJob spec is honoured, noted or refused by the local runner
(monarch_spmd.runner.LOCAL_FIELDS), as the README promises: the fields are enumerated from the
spec's schema (monarch_spmd.spec.SPEC), so a field added to the spec fails here until the runner
says what it does with it; each noted field, set in a manifest, gets its one-line note."""

from __future__ import annotations

import pytest

from monarch_spmd import runner

#: A valid value for each field the runner notes (the manifest sets it; the note must name it).
SAMPLES = {
    "image": {"image": "registry.example/train:1"},
    "python": {"python": "python3.11"},
    "colocate": {"colocate": True},
    "spares": {"spares": 1},
    "restartPolicy.podReplacementPolicy": {"restartPolicy": {"podReplacementPolicy": "TerminatingOrFailed"}},
    "restartPolicy.replacementTimeoutSeconds": {"restartPolicy": {"replacementTimeoutSeconds": 30}},
    "restartPolicy.mode": {"restartPolicy": {"mode": "RecreatePods"}},
    "failureOutput": {"failureOutput": "None"},
    "ttlSecondsAfterFinished": {"ttlSecondsAfterFinished": 60},
    "shmSize": {"shmSize": "1Gi"},
    "scheduling.provider": {"scheduling": {"provider": "Kueue", "queue": "team-a"}},
    "scheduling.queue": {"scheduling": {"provider": "Kueue", "queue": "team-a"}},
    "scheduling.schedulerName": {"scheduling": {"provider": "Coscheduling", "schedulerName": "scheduler-plugins"}},
    "scheduling.timeoutSeconds": {"scheduling": {"timeoutSeconds": 600}},
    "template.metadata.labels": {"template": {"metadata": {"labels": {"team": "a"}}}},
    "template.metadata.annotations": {"template": {"metadata": {"annotations": {"note": "x"}}}},
    "template.spec.*": {"template": {"spec": {"nodeSelector": {"pool": "gpu"}}}},
}
REFUSALS = {
    "suspend": ({"suspend": True}, "spec.suspend: true holds the job"),
    "mode": ({"mode": "Monarch", "podLayout": "PerHost", "args": None}, "spec.mode: Monarch serves"),
    "replicaGroups.*": ({"replicaGroups": {"count": 2}}, "spec.replicaGroups: a local run takes replica groups as flags"),
}


def job(extra: dict) -> runner.LocalJob:
    spec = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["x.py"], **extra}
    spec = {k: v for k, v in spec.items() if v is not None}
    return runner.job_from_manifest({"apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob",
                                     "metadata": {"name": "fields"}, "spec": spec})


LEAVES = list(runner.spec_leaves())


def test_every_field_of_the_spec_is_classified():
    assert len(LEAVES) > 20 and "restartPolicy.maxRestarts" in LEAVES and "template.spec.*" in LEAVES
    missing = [leaf for leaf in LEAVES if leaf not in runner.LOCAL_FIELDS]
    assert not missing, f"say in runner.LOCAL_FIELDS what a local run does with: {missing}"


@pytest.mark.parametrize("leaf", [leaf for leaf in LEAVES if runner.LOCAL_FIELDS.get(leaf, ("",))[0] == runner.NOTED])
def test_each_noted_field_gets_its_note(leaf):
    assert leaf in SAMPLES, f"add a sample value for {leaf}"
    _, notes = runner.check_local(job(SAMPLES[leaf]), gpus=0)
    named = leaf[:-1] if leaf.endswith(".*") else leaf
    assert any(n.startswith(f"not used locally: spec.{named}") for n in notes), notes


@pytest.mark.parametrize("leaf", [leaf for leaf in LEAVES if runner.LOCAL_FIELDS.get(leaf, ("",))[0] == runner.REFUSED])
def test_each_refused_field_is_refused_naming_it(leaf):
    extra, message = REFUSALS[leaf]
    with pytest.raises(runner.LocalRunError, match=message.replace(".", r"\.")):
        runner.check_local(job(extra), gpus=0)


def test_honoured_fields_get_no_note():
    honoured = {"masterPort": 29511, "restartPolicy": {"maxRestarts": 2, "permanentExitCodes": [3]},
                "rendezvousTimeoutSeconds": 30, "activeDeadlineSeconds": 60, "podLayout": "PerHost",
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "trainer", "env": [
                    {"name": "A", "value": "1"}]}]}}}
    env, notes = runner.check_local(job(honoured), gpus=0)
    assert notes == [] and env == {"A": "1"}


def test_gpus_this_machine_does_not_have_are_noted_not_faked():
    _, notes = runner.check_local(job({"gpusPerProc": 1}), gpus=0)
    assert notes == ["spec.gpusPerProc: 1 asks for 4 GPUs in all and this machine has 0: CUDA_VISIBLE_DEVICES "
                     "is left as it is (the ranks see what this machine has)"]
    assert runner.check_local(job({"gpusPerProc": 1}), gpus=4)[1] == []


def test_the_trainer_containers_cluster_fields_and_sidecars_are_noted():
    template = {"spec": {"containers": [
        {"name": "trainer", "resources": {"limits": {"cpu": "2"}}, "env": [{"name": "A", "value": "1"}]},
        {"name": "logs", "image": "busybox", "command": ["sh"]}]}}
    _, notes = runner.check_local(job({"template": template}), gpus=0)
    assert any(n.startswith("not used locally: spec.template.spec.containers[0].resources") for n in notes), notes
    assert any("spec.template.spec.containers[1] (the sidecar 'logs')" in n for n in notes), notes
