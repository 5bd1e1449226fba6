"""torchrun's flags after '--' mean what they mean before it: for every flag monarch-spmd maps
(monarch_spmd.torchrun.FLAGS), in each spelling torchrun accepts (``--max-restarts 3``,
``--max_restarts 3``, ``--max-restarts=3``, ``-t3``), with and without the word torchrun, in
``manifest`` (the same SPMDJob, the same notes, the same refusal) and ``run`` (the same job handed
to the runner, nothing started). A flag nothing maps is refused naming it and what to do."""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

import pytest

from monarch_spmd import cli, runner, torchrun

#: A valid value of each flag that takes one (some are refused whatever their value: so be it,
#: the refusal must then be the same wherever the flag stands).
VALUES = {
    "nnodes": "2", "nproc_per_node": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "head:29400", "rdzv_id": "abc",
    "rdzv_conf": "timeout=5", "max_restarts": "3", "monitor_interval": "1", "start_method": "spawn",
    "event_log_handler": "null", "role": "trainer", "log_dir": "logs", "redirects": "3", "tee": "1",
    "log_line_prefix_template": "[x]", "local_ranks_filter": "0", "duplicate_stdout_filters": "err",
    "duplicate_stderr_filters": "err", "node_rank": "0", "master_addr": "127.0.0.1", "master_port": "29511",
    "local_addr": "a", "logs_specs": "x", "numa_binding": "node", "signals_to_handle": "SIGTERM",
    "shutdown_timeout": "3", "print_completion": "bash",
}


def spellings() -> list[tuple[str, list[str], list[str]]]:
    """``(id, the flag's words, the script's words)`` for every spelling of every flag."""
    out = []
    for flag in torchrun.FLAGS:
        script = ["train"] if flag.dest == "module" else ["-m", "train"]
        for name in flag.names:
            if flag.metavar is None:
                out.append((name, [name], script))
                continue
            value = VALUES[flag.dest]
            out.append((f"{name} {value}", [name, value], script))
            out.append((f"{name}{'' if len(name) == 2 else '='}{value}",
                        [f"{name}{'' if len(name) == 2 else '='}{value}"], script))
    return out


SPELLINGS = spellings()


def test_every_flag_and_spelling_is_in_the_table():
    assert {f.dest for f in torchrun.FLAGS} <= set(VALUES) | {f.dest for f in torchrun.FLAGS if f.metavar is None}
    said = {words[0].split("=")[0] for _, words, _ in SPELLINGS}
    assert "--max_restarts" in said and "--max-restarts" in said and "-t" in said and "--nproc_per_node" in said


def call(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:  # argparse's usage errors
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def _manifest(code: int, out: str, err: str) -> tuple[int, list[str], str]:
    """The outcome without the comment line, which repeats the command line."""
    return code, [line for line in out.splitlines() if not line.startswith("# monarch-spmd manifest ")], err


MANIFEST = ["manifest", "--image", "img:1", "--gpus-per-proc", "0"]


@pytest.mark.parametrize("name, words, script", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_manifest_reads_a_flag_after_double_dash_as_before_it(name, words, script):
    before = _manifest(*call(*MANIFEST, *words, *script))
    for launcher in ([], ["torchrun"], ["python3", "-m", "torch.distributed.run"]):
        after = _manifest(*call(*MANIFEST, "--", *launcher, *words, *script))
        assert after == before, (launcher, after, before)


@pytest.fixture
def runs(monkeypatch) -> list[dict[str, Any]]:
    """What `run` hands the runner (nothing starts)."""
    seen: list[dict[str, Any]] = []

    def fake(job, **kwargs):
        run_id = kwargs.get("run_id") or ""
        if re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", run_id):
            kwargs["run_id"] = "<a fresh uuid>"
        seen.append({"job": job, **kwargs})
        return 0

    monkeypatch.setattr(runner, "run", fake)
    return seen


@pytest.mark.parametrize("name, words, script", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_run_reads_a_flag_after_double_dash_as_before_it(name, words, script, runs):
    before = call("run", *words, *script)
    handed = list(runs)
    for launcher in ([], ["torchrun"]):
        runs.clear()
        after = call("run", "--", *launcher, *words, *script)
        assert after == before and runs == handed, (launcher, after, before)


@pytest.mark.parametrize("argv", [
    ["--mesh", "hosts=2", "--", "--max-restarts", "2", "-m", "train"],
    ["--mesh", "hosts=2", "--", "--master_port=29511", "-m", "train"],
])
def test_run_with_a_mesh_takes_the_shared_flags_after_double_dash_too(argv, runs):
    flag = argv[3].split("=")[0]
    value = argv[4] if "=" not in argv[3] else argv[3].split("=")[1]
    assert call("run", *argv)[0] == 0
    assert call("run", "--mesh", "hosts=2", flag, value, "--", "-m", "train")[0] == 0
    assert runs[0]["job"] == runs[1]["job"]


@pytest.mark.parametrize("argv, message", [
    (["manifest", "--image", "i", "--gpus-per-proc", "0", "--", "torchrun", "--max-restart-count", "3", "-m", "t"],
     "unrecognized arguments: --max-restart-count (not a torchrun flag monarch-spmd knows: docs/torchrun.md lists "
     "torch 2.14's and what each does here); check its spelling, drop it, or, if the training script takes it, put it "
     "after the script"),
    (["manifest", "--image", "i", "--gpus-per-proc", "0", "--", "--bogus=1", "-m", "t"],
     "unrecognized arguments: --bogus (not a torchrun flag monarch-spmd knows"),
    (["manifest", "--image", "i", "--", "torchrun", "--gpus-per-proc", "1", "-m", "t"],
     "--gpus-per-proc: an option of monarch-spmd manifest, not of torchrun: give it before '--'"),
    (["run", "--", "--bogus", "-m", "t"], "unrecognized arguments: --bogus (not a torchrun flag"),
    (["run", "--nproc-per-node", "2", "--", "--grace-period", "3", "t.py"],
     "--grace-period: an option of monarch-spmd run, not of torchrun: give it before '--'"),
    (["run", "--max-restarts", "1", "--", "--max_restarts", "2", "t.py"],
     "--max-restarts: given before '--' and after it; give it once"),
    (["run", "--mesh", "hosts=2", "--", "--nnodes", "2", "-m", "t"],
     "--nnodes and --mesh hosts=2: both give the job's shape"),
])
def test_a_flag_nothing_maps_is_refused_naming_it_and_what_to_do(argv, message, runs):
    code, out, err = call(*argv)
    assert code == 2 and message in err, err
    assert "what to do" not in err and not runs and out == ""
