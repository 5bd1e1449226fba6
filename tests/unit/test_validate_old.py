"""`monarch-spmd validate --old FILE`: a manifest checked as an update of the job as stored, with the
CRD's transition rules (the fields that shape the pods change only while the job is suspended)."""

from __future__ import annotations

import yaml

from monarch_spmd import validate

STORED = {"apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob", "metadata": {"name": "train"},
          "spec": {"mesh": [{"name": "a", "size": 2}], "args": ["x.py"], "image": "img:1", "masterPort": 29500,
                   "shmSize": "0"},
          "status": {"phase": "Running"}}


def update(tmp_path, capsys, **spec):
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [STORED]}))
    new = tmp_path / "new.yaml"
    doc = {k: v for k, v in STORED.items() if k != "status"}
    new.write_text(yaml.safe_dump({**doc, "spec": {**doc["spec"], **spec}}))
    code = validate.main(["--old", str(old), "-f", str(new)])
    return code, capsys.readouterr().out


def test_a_pod_shaping_change_of_a_running_job_is_refused_naming_the_field(tmp_path, capsys):
    code, out = update(tmp_path, capsys, masterPort=29501)
    assert code == 1
    assert "spec.masterPort: is immutable while the job is not suspended" in out and "spec.suspend" in out


def test_the_same_change_while_suspended_passes_and_a_newer_rule_is_ratcheted(tmp_path, capsys):
    # shmSize "0" breaks a rule newer than the stored job: unchanged, it is not checked on an update.
    code, out = update(tmp_path, capsys, masterPort=29501, suspend=True)
    assert code == 0, out
    code, out = update(tmp_path, capsys, activeDeadlineSeconds=60)
    assert code == 0, out


def test_without_old_it_is_a_create(tmp_path, capsys):
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in STORED.items() if k != "status"}))
    assert validate.main(["-f", str(path)]) == 1
    assert "spec.shmSize: '0' is not valid: must be a memory quantity from 1Mi to 1Ti" in capsys.readouterr().out
