"""Unit tests of `monarch-spmd logs`' pure parts: arguments, pod selection, line splitting."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import threading

import pytest

from monarch_spmd import logs


def pod(name: str, job: str, rank: int, restart: int, phase: str = "Running", uid: str | None = None) -> dict:
    uid = uid or f"uid-{job}"
    return {
        "metadata": {
            "name": name,
            "labels": {logs.JOB_LABEL: job, logs.JOB_UID_LABEL: uid, logs.RANK_LABEL: str(rank),
                       logs.RESTART_LABEL: str(restart)},
            "ownerReferences": [{"kind": "SPMDJob", "name": job, "uid": uid, "controller": True}],
        },
        "status": {"phase": phase},
    }


PODS = [pod(f"hello-r0-{r}", "hello", r, 0, "Failed") for r in (3, 1, 0, 2)] + [
    pod(f"hello-r1-{r}", "hello", r, 1) for r in (1, 0, 3, 2)
] + [pod("other-r1-0", "other", 0, 1)]


def names(selected):
    return [(rank, p["metadata"]["name"]) for rank, p in selected]


def test_import_stays_stdlib_only():
    code = "import sys, monarch_spmd.logs; print(sorted(m for m in ('kubernetes', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "text, expected",
    [("3", [3]), ("0,2", [0, 2]), ("4-7", [4, 5, 6, 7]), ("0, 4-5", [0, 4, 5]), ("2-2", [2])],
)
def test_parse_ranks(text, expected):
    assert logs.parse_ranks(text) == expected


@pytest.mark.parametrize("text", ["", "a", "-1", "3-1", "1-", "1,,2"])
def test_parse_ranks_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="rank"):
        logs.parse_ranks(text)


def test_parse_args_merges_rank_options():
    opts = logs.parse_args(["hello", "-n", "team-a", "--rank", "3", "--rank", "0-1", "--rank", "1", "-f", "--restart", "2"])
    assert (opts.job, opts.namespace, opts.ranks, opts.follow, opts.restart) == ("hello", "team-a", [0, 1, 3], True, 2)
    assert opts.container == "trainer"
    defaults = logs.parse_args(["hello"])
    assert (defaults.ranks, defaults.follow, defaults.restart, defaults.namespace) == (None, False, None, None)


@pytest.mark.parametrize("argv", [[], ["hello", "--restart", "-1"], ["hello", "--rank", "x"], ["hello", "--tail", "no"]])
def test_parse_args_rejects(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        logs.parse_args(argv)
    assert exc.value.code == 2
    assert "monarch-spmd logs" in capsys.readouterr().err


@pytest.mark.parametrize(
    "job, expected",
    [
        ({"status": {"restarts": 2}}, 2),
        ({"status": {}}, 0),
        ({}, 0),
        ({"status": None}, 0),
        ({"status": {"restarts": True}}, 0),
        ({"status": {"restarts": -1}}, 0),
    ],
)
def test_current_restart(job, expected):
    assert logs.current_restart(job) == expected


def test_select_pods_keeps_one_attempt_in_rank_order():
    assert names(logs.select_pods(PODS, "hello", "uid-hello", 1)) == [(r, f"hello-r1-{r}") for r in range(4)]
    assert names(logs.select_pods(PODS, "hello", "uid-hello", 0)) == [(r, f"hello-r0-{r}") for r in range(4)]


def test_select_pods_filters_ranks():
    assert names(logs.select_pods(PODS, "hello", "uid-hello", 1, [3, 0])) == [(0, "hello-r1-0"), (3, "hello-r1-3")]


def test_select_pods_ignores_other_jobs():
    assert names(logs.select_pods(PODS, "other", "uid-other", 1)) == [(0, "other-r1-0")]


def test_select_pods_ignores_a_deleted_namesakes_pods():
    """A job deleted with --cascade=orphan leaves pods with its name label; a new job of the same name
    has another uid, and only its own pods are its."""
    orphans = [pod(f"hello-old-r0-{r}", "hello", r, 0, uid="uid-old") for r in range(4)]
    for p in orphans:
        p["metadata"]["ownerReferences"] = []  # the garbage collector drops them when it orphans a pod
    with pytest.raises(logs.NoPodsYet):
        logs.select_pods(orphans, "hello", "uid-new", 0)
    mixed = orphans + [pod(f"hello-new-r0-{r}", "hello", r, 0, uid="uid-new") for r in range(4)]
    assert names(logs.select_pods(mixed, "hello", "uid-new", 0)) == [(r, f"hello-new-r0-{r}") for r in range(4)]
    adopted = pod("hello-x-r0-0", "hello", 0, 0, uid="uid-new")
    adopted["metadata"]["ownerReferences"][0]["uid"] = "uid-someone-else"
    with pytest.raises(logs.NoPodsYet):
        logs.select_pods([adopted], "hello", "uid-new", 0)


@pytest.mark.parametrize("flag", ["-r", "-r0", "-r=1"])
def test_r_is_not_the_rank_here_and_the_message_says_so(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        logs.parse_args(["hello", flag, "0"] if flag == "-r" else ["hello", flag])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: not an option of monarch-spmd logs" in err and "give --rank R" in err


def test_a_failed_job_ends_with_the_per_rank_table_on_stderr():
    job = {"metadata": {"name": "hello", "uid": "uid-hello"}, "spec": {"mesh": [{"name": "procs", "size": 2}]},
           "status": {"phase": "Failed", "restarts": 0, "failure": {"rank": 1, "exitCode": 137, "reason": "OOMKilled",
                                                                      "restart": 0}}}
    failed = pod("hello-r0-1", "hello", 1, 0, "Failed")
    failed["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": 137,
                                                                                          "reason": "OOMKilled"}}}]
    err = io.StringIO()
    logs.summarize(job, [pod("hello-r0-0", "hello", 0, 0), failed], err)
    lines = err.getvalue().splitlines()
    assert lines[0] == "Ranks of attempt 0:" and "<- first failure" in lines[3]
    assert lines[-1] == "spmdjob hello failed: rank 1 (local rank 1, pod hello-r0-1) failed first: exit code 137 (SIGKILL, OOMKilled)"
    quiet = io.StringIO()
    logs.summarize({**job, "status": {"phase": "Succeeded"}}, [], quiet)
    assert quiet.getvalue() == ""


def test_select_pods_no_pods_yet():
    with pytest.raises(logs.NoPodsYet, match="spmdjob fresh has no pods yet"):
        logs.select_pods(PODS, "fresh", "uid-fresh", 0)


def test_select_pods_unknown_restart_names_existing_ones():
    with pytest.raises(logs.LogsError, match=r"no pods of restart 5; pods exist for restart\(s\) 0, 1") as exc:
        logs.select_pods(PODS, "hello", "uid-hello", 5)
    assert not isinstance(exc.value, logs.NoPodsYet)


def test_select_pods_unknown_rank_names_existing_ones():
    with pytest.raises(logs.LogsError, match=r"no pod for rank\(s\) 7, 9; it has rank\(s\) 0-3"):
        logs.select_pods(PODS, "hello", "uid-hello", 1, [0, 7, 9])


def test_rank_prefix():
    assert logs.rank_prefix(12) == "[rank 12] "


def test_line_splitter_joins_lines_split_across_chunks():
    s = logs.LineSplitter("[rank 1] ")
    assert s.feed(b"hel") == []
    assert s.feed(b"lo\nwor") == ["[rank 1] hello"]
    assert s.feed(b"ld\r\n\nend") == ["[rank 1] world", "[rank 1] "]
    assert s.flush() == ["[rank 1] end"]
    assert s.flush() == []


def test_line_splitter_keeps_utf8_split_mid_character():
    data = "naïve ✓\n".encode()
    s = logs.LineSplitter("")
    out = []
    for i in range(len(data)):
        out += s.feed(data[i : i + 1])
    assert out == ["naïve ✓"]


def test_line_splitter_replaces_undecodable_bytes():
    assert logs.prefix_lines("[rank 0] ", b"ok \xff\n") == ["[rank 0] ok \ufffd"]


def test_prefix_lines_whole_log():
    assert logs.prefix_lines("[rank 2] ", "a\nb\n") == ["[rank 2] a", "[rank 2] b"]
    assert logs.prefix_lines("[rank 2] ", "a\nno newline") == ["[rank 2] a", "[rank 2] no newline"]
    assert logs.prefix_lines("[rank 2] ", b"") == []


def test_output_from_many_threads_keeps_lines_whole():
    stream = io.StringIO()
    out = logs._Output(stream)

    def writer(rank: int) -> None:
        splitter = logs.LineSplitter(logs.rank_prefix(rank))
        for i in range(200):
            # Chunks that cut lines in two, as a log stream does.
            out.lines(splitter.feed(f"line {i} of rank {rank}\nline".encode()))
            out.lines(splitter.feed(f" {i}b of rank {rank}\n".encode()))

    threads = [threading.Thread(target=writer, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 * 200 * 2
    for rank in range(4):
        mine = [l for l in lines if l.startswith(f"[rank {rank}] ")]
        expected = []
        for i in range(200):
            expected += [f"[rank {rank}] line {i} of rank {rank}", f"[rank {rank}] line {i}b of rank {rank}"]
        assert mine == expected


def test_main_reports_missing_kubeconfig(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert logs.main(["hello", "--kubeconfig", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("monarch-spmd logs: error: cannot load kubeconfig") and str(missing) in err


def host_pod(name: str, first: int, procs: int, containers=("trainer",)) -> dict:  # noqa: D103
    p = pod(name, "wide", first, 0)
    p["metadata"]["labels"][logs.PROCS_LABEL] = str(procs)
    p["spec"] = {"containers": [{"name": c} for c in containers]}
    return p


HOSTS = [host_pod("wide-r0-0", 0, 4), host_pod("wide-r0-1", 4, 4)]


def test_a_per_host_pod_is_selected_by_any_of_its_ranks():
    assert names(logs.select_pods(HOSTS, "wide", "uid-wide", 0, [5])) == [(4, "wide-r0-1")]
    assert names(logs.select_pods(HOSTS, "wide", "uid-wide", 0, [3, 4])) == [(0, "wide-r0-0"), (4, "wide-r0-1")]
    with pytest.raises(logs.LogsError, match="no pod for rank.s. 8; it has rank.s. 0-7"):
        logs.select_pods(HOSTS, "wide", "uid-wide", 0, [8])


def test_a_per_host_pods_lines_keep_their_own_prefixes_and_are_filtered_by_rank():
    log = b"monarch-spmd worker: ranks 4..7/8\n[rank 4] a\n[rank 5] b\n[rank 6] c\n"
    everything = logs.splitter_for(HOSTS[1], None)
    assert everything.feed(log) == ["monarch-spmd worker: ranks 4..7/8", "[rank 4] a", "[rank 5] b", "[rank 6] c"]
    only = logs.splitter_for(HOSTS[1], [5, 6])
    assert only.feed(log) == ["[rank 5] b", "[rank 6] c"]
    one = pod("hello-r1-3", "hello", 3, 1)
    assert logs.splitter_for(one, None).feed(b"x\n") == ["[rank 3] x"]
    single = host_pod("wide-r0-2", 8, 1)  # PerHost with one proc per pod: its worker prefixed it already
    assert logs.splitter_for(single, None).feed(b"[rank 8] x\n") == ["[rank 8] x"]


def test_a_container_that_does_not_exist_is_a_clear_error():
    logs.check_container(HOSTS[0], "trainer")
    with pytest.raises(logs.LogsError, match="pod wide-r0-0 has no container 'typo'; its containers are trainer"):
        logs.check_container(HOSTS[0], "typo")
