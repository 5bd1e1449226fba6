"""`monarch-spmd validate`: SPMDJob manifests checked offline, errors naming file, document and field."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from monarch_spmd import validate

from .conftest import ROOT, cli_cmd, run

GOOD = """\
apiVersion: spmd.monarch.dev/v1alpha1
kind: SPMDJob
metadata: {name: good}
spec:
  mesh: [{name: hosts, size: 2}, {name: gpus, size: 2}]
  args: [-m, train]
  image: python:3.11-slim
"""

BAD = """\
apiVersion: spmd.monarch.dev/v1alpha1
kind: SPMDJob
metadata: {name: bad}
spec:
  mesh: [{name: hosts, size: 0}, {name: hosts, size: 2}]
  args: ["-m"]
  image: "a b"
  restartPolicy: {podReplacementPolicy: Sometimes}
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def check(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = validate.main(list(args))
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_examples_are_valid(capsys):
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    code, out, err = check(capsys, *examples)
    assert code == 0, out + err
    lines = out.splitlines()
    assert [line for line in lines if ": note: " not in line] == [f"{p}: 1 SPMDJob(s) valid" for p in examples]
    # A note is no error: the gang examples ask for GPUs and leave the toleration to the cluster.
    noted = [line.split(": doc 1 ")[0] for line in lines if ": note: " in line]
    assert noted == [str(ROOT / "examples" / f"gang-{p}.yaml") for p in ("coscheduling", "kueue", "volcano")], lines


def test_every_error_is_printed_with_file_document_name_and_field(tmp_path, capsys):
    path = write(tmp_path, "jobs.yaml", GOOD + "---\n" + BAD)
    code, out, _ = check(capsys, "-f", path)
    assert code == 1
    lines = out.splitlines()
    assert all(line.startswith(f"{path}: doc 2 (bad): ") for line in lines), lines
    fields = [line.split(": ")[2] for line in lines]
    # The enum's error is blocking: as on the API server, no CEL rule is evaluated after it.
    assert fields == ["spec.mesh[0].size", "spec.restartPolicy.podReplacementPolicy"]
    assert "expected an integer in 1..4096" in lines[0]
    assert "one of Failed, TerminatingOrFailed" in lines[1]


def test_rule_errors_when_the_types_are_right(tmp_path, capsys):
    path = write(tmp_path, "bad.yaml", BAD.replace("  restartPolicy: {podReplacementPolicy: Sometimes}\n", ""))
    code, out, _ = check(capsys, path)
    assert code == 1
    fields = [line.split(": ")[2] for line in out.splitlines()]
    assert fields == ["spec.mesh[0].size", "spec.mesh[1].name", "spec.args", "spec.image"]
    assert "appears twice" in out and "'-m' needs a module name" in out and "printable ASCII" in out


def test_several_files_and_stdin(tmp_path, capsys, monkeypatch):
    good = write(tmp_path, "good.yaml", GOOD)
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD.replace("name: good", "name: Bad")))
    code, out, _ = check(capsys, good, "-")
    assert code == 1
    assert f"{good}: 1 SPMDJob(s) valid" in out
    assert "<stdin>: doc 1 (Bad): metadata.name: 'Bad' is not valid; a job name is a DNS-1035 label" in out


def test_other_kinds_are_skipped_and_lists_are_checked_item_by_item(tmp_path, capsys):
    config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n"
    job_list = "apiVersion: v1\nkind: List\nitems:\n" + textwrap.indent(
        "- " + GOOD.replace("\n", "\n  ").rstrip() + "\n- " + BAD.replace("\n", "\n  ").rstrip() + "\n", "")
    path = write(tmp_path, "mixed.yaml", config_map + "---\n" + job_list)
    code, out, _ = check(capsys, path)
    assert code == 1
    assert {line.split(": ")[1] for line in out.splitlines()} == {"doc 2 item 2 (bad)"}
    path = write(tmp_path, "only-config.yaml", config_map)
    code, out, _ = check(capsys, path)
    assert code == 1 and out == f"{path}: no SPMDJob document (found: ConfigMap)\n"


def test_yaml_is_read_as_kubectl_reads_it(tmp_path, capsys):
    # y is true, 1e3 is a number, a date is a string: kubectl applies this manifest.
    path = write(tmp_path, "dialect.yaml", GOOD + "  suspend: y\n  masterPort: 1e3\n  template:\n"
                 "    metadata: {annotations: {built: 2024-01-01}}\n")
    assert check(capsys, path)[0] == 0
    # 017 is the integer 15 to kubectl, not a string: an argument must be quoted.
    path = write(tmp_path, "octal.yaml", GOOD.replace("args: [-m, train]", "args: [train.py, 017]"))
    code, out, _ = check(capsys, path)
    assert code == 1 and "spec.args[1]: 15 is not valid; expected a string (quote it in YAML)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no file given"),
        (["-f"], "argument -f/--filename: expected one argument"),
        (["--frobnicate", "x.yaml"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_usage_errors_exit_2(capsys, args, message):
    code, _, err = check(capsys, *args)
    assert code == 2 and message in err and "usage: monarch-spmd validate" in err


def test_unreadable_files_exit_2_and_the_others_are_still_checked(tmp_path, capsys):
    good = write(tmp_path, "good.yaml", GOOD)
    broken = write(tmp_path, "broken.yaml", "spec: [unclosed\n")
    code, out, err = check(capsys, str(tmp_path / "missing.yaml"), broken, good)
    assert code == 2
    assert f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory" in err
    assert f"{broken}: not valid YAML:" in err
    assert f"{good}: 1 SPMDJob(s) valid" in out


def test_infinite_numbers_cannot_be_sent(tmp_path, capsys):
    path = write(tmp_path, "inf.yaml", GOOD + "  masterPort: .inf\n")
    code, _, err = check(capsys, path)
    assert code == 2 and "cannot become JSON" in err


def test_the_console_script_dispatches_validate(tmp_path):
    path = write(tmp_path, "good.yaml", GOOD)
    result = run(cli_cmd("validate", "-f", path))
    assert result.returncode == 0 and result.stdout == f"{path}: 1 SPMDJob(s) valid\n", result.stderr
    result = run(cli_cmd("--help"))
    assert "  validate " in result.stdout


def test_help_is_argparses_and_exits_0():
    result = run(cli_cmd("validate", "--help"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: monarch-spmd validate [-R] [-f FILE|DIR|-]")
    assert "-R, --recursive" in result.stdout and "Exit code 0" in result.stdout


def test_a_folder_is_read_as_kubectl_apply_reads_it(tmp_path, capsys):
    """`validate -f dir/` checks every .yaml/.yml/.json in it, in name order; other files and
    subfolders (without -R) are left alone; a file of other kinds is skipped, not an error."""
    folder = tmp_path / "manifests"
    (folder / "nested").mkdir(parents=True)
    write(folder, "b-good.yml", GOOD)
    write(folder, "a-config.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    write(folder, "notes.txt", "not a manifest: [")
    (folder / "c.json").write_text('{"apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob", '
                                   '"metadata": {"name": "j"}, "spec": {"mesh": [{"name": "p", "size": 2}], '
                                   '"args": ["x.py"], "image": "i"}}')
    write(folder / "nested", "bad.yaml", BAD)
    code, out, err = check(capsys, "-f", str(folder))
    assert code == 0, out + err
    assert out.splitlines() == [f"{folder}/a-config.yaml: no SPMDJob document (found: ConfigMap); skipped",
                                f"{folder}/b-good.yml: 1 SPMDJob(s) valid", f"{folder}/c.json: 1 SPMDJob(s) valid"]
    code, out, _ = check(capsys, "-R", "-f", str(folder) + "/")
    assert code == 1 and f"{folder}/nested/bad.yaml: doc 1 (bad): spec.mesh[0].size" in out


def test_a_folder_without_manifests_or_without_jobs_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "deeper").mkdir(parents=True)
    write(empty / "deeper", "job.yaml", GOOD)
    code, _, err = check(capsys, str(empty))
    assert code == 2 and f"{empty}: no .yaml, .yml, .json file in this folder (-R looks in its subfolders too)" in err
    assert check(capsys, "-R", str(empty))[0] == 0
    others = tmp_path / "others"
    others.mkdir()
    write(others, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    code, out, _ = check(capsys, str(others))
    assert code == 1 and out.splitlines()[-1] == f"{others}: no SPMDJob document in the folder's 1 manifest file(s)"


ELASTIC = GOOD.replace("name: good", "name: elastic").replace(
    "mesh: [{name: hosts, size: 2}, {name: gpus, size: 2}]",
    "mesh: [{name: hosts, size: 4, minSize: 2}, {name: gpus, size: 2}]\n  podLayout: PerHost")


def test_an_elastic_wait_as_long_as_the_join_timeout_is_refused(tmp_path, capsys):
    path = write(tmp_path, "elastic.yaml", ELASTIC + "  restartPolicy: {elasticWaitSeconds: 120}\n")
    code, out, _ = check(capsys, "-f", path)
    assert code == 1
    assert out.startswith(f"{path}: doc 1 (elastic): spec.restartPolicy.elasticWaitSeconds: 120 is not below "
                          "restartPolicy.joinTimeoutSeconds (120);"), out
    assert "give elasticWaitSeconds below 120 (0..119), or raise joinTimeoutSeconds above 120" in out
    path = write(tmp_path, "fine.yaml", ELASTIC + "  restartPolicy: {elasticWaitSeconds: 30, joinTimeoutSeconds: 300}\n")
    assert check(capsys, "-f", path)[:2] == (0, f"{path}: 1 SPMDJob(s) valid\n")


def test_a_toleration_operator_kubernetes_does_not_know_is_refused(tmp_path, capsys):
    text = GOOD + "  template:\n    spec:\n      tolerations: [{key: nvidia.com/gpu, operator: Exist}]\n"
    path = write(tmp_path, "typo.yaml", text)
    code, out, _ = check(capsys, "-f", path)
    assert code == 1
    assert out == (f"{path}: doc 1 (good): spec.template.spec.tolerations[0].operator: 'Exist' is not valid; "
                   "expected one of Exists, Equal (or empty)\n")


def test_a_gpu_job_without_a_gpu_toleration_is_valid_with_a_note(tmp_path, capsys):
    path = write(tmp_path, "gpu.yaml", GOOD + "  gpusPerProc: 1\n")
    code, out, _ = check(capsys, "-f", path)
    assert code == 0
    note, valid = out.splitlines()
    assert note.startswith(f"{path}: doc 1 (good): note: spec.template.spec.tolerations: the pods request "
                           "nvidia.com/gpu (spec.gpusPerProc 1) but tolerate no GPU taint")
    assert valid == f"{path}: 1 SPMDJob(s) valid"
    tolerated = GOOD + ("  gpusPerProc: 1\n  template:\n    spec:\n"
                        "      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n")
    path = write(tmp_path, "tolerated.yaml", tolerated)
    assert check(capsys, "-f", path)[:2] == (0, f"{path}: 1 SPMDJob(s) valid\n")
