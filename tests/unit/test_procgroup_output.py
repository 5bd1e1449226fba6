"""How the gang copies output (monarch_spmd.payload.procgroup.Prefixer): partial lines and carriage
returns pass as they arrive, every line and every rewritten line keeps its rank prefix, and one
source's open line is ended before another's output. Also torchrun's log-file layout and the
return codes as torchrun prints them. The same code under real processes: tests/lib/test_output.py."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from monarch_spmd.payload import procgroup


def prefixer():
    chunks: list[tuple[int, bytes]] = []
    return procgroup.Prefixer(lambda which, data: chunks.append((which, data))), chunks


def joined(chunks, which=1) -> bytes:
    return b"".join(d for w, d in chunks if w == which)


def test_a_partial_line_is_passed_on_at_once_and_prefixed_once():
    p, chunks = prefixer()
    p.feed("r0", 1, b"loading", b"[rank 0] ")
    assert chunks == [(1, b"[rank 0] loading")]  # not held back until the newline
    p.feed("r0", 1, b"... done\n", b"[rank 0] ")
    assert joined(chunks) == b"[rank 0] loading... done\n"


def test_a_progress_bar_keeps_its_prefix_on_every_rewrite():
    p, chunks = prefixer()
    for i in range(3):
        p.feed("r1", 2, b"\r%d%%|#" % (i * 50), b"[rank 1] ")
    p.feed("r1", 2, b"\n", b"[rank 1] ")
    assert joined(chunks, 2) == b"\r[rank 1] 0%|#\r[rank 1] 50%|#\r[rank 1] 100%|#\n"


def test_another_sources_output_ends_the_open_line_first_and_its_newline_is_not_doubled():
    p, chunks = prefixer()
    p.feed("a", 1, b"half", b"[rank 0] ")
    p.feed("b", 1, b"whole line\n", b"[rank 1] ")
    p.feed("a", 1, b"\n", b"[rank 0] ")  # a's own end of the line that was ended for it
    p.feed("a", 1, b"next\n", b"[rank 0] ")
    assert joined(chunks) == b"[rank 0] half\n[rank 1] whole line\n[rank 0] next\n"


def test_a_continued_line_gets_a_fresh_prefix_after_an_interruption():
    p, chunks = prefixer()
    p.feed("a", 1, b"epoch 1: ", b"[rank 0] ")
    p.feed("b", 1, b"x\n", b"[rank 1] ")
    p.feed("a", 1, b"loss 0.5\n", b"[rank 0] ")
    assert joined(chunks) == b"[rank 0] epoch 1: \n[rank 1] x\n[rank 0] loss 0.5\n"


def test_streams_are_separate_and_own_lines_end_open_ones():
    p, chunks = prefixer()
    p.feed("a", 1, b"out", b"[rank 0] ")
    p.feed("a", 2, b"err\n", b"[rank 0] ")
    p.line(2, "[monarch-spmd] note")
    p.end("a", 1)  # the stream closed with its line open
    assert joined(chunks, 1) == b"[rank 0] out\n"
    assert joined(chunks, 2) == b"[rank 0] err\n[monarch-spmd] note\n"


def test_crlf_and_unprefixed_sources():
    p, chunks = prefixer()
    p.feed("worker", 1, b"[rank 4] a\r\n[rank 5] b\n")
    assert joined(chunks) == b"[rank 4] a\r\n[rank 5] b\n"


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("3", 3), ("0:3,1:2", {0: 3, 1: 2}), (" 1 ", 1)])
def test_torchruns_std_values(text, value):
    assert procgroup.parse_std(text, "--tee") == value


@pytest.mark.parametrize("text", ["4", "-1", "a", "0:4", "0:1,", ""])
def test_bad_std_values_name_the_flag(text):
    with pytest.raises(ValueError, match="^--redirects: "):
        procgroup.parse_std(text, "--redirects")


def test_log_files_are_laid_out_as_torchrun_lays_them_out(tmp_path):
    attempt = tmp_path / "run_x" / "attempt_2"
    redirected = procgroup.log_files(str(attempt), 0, 3, 0)
    assert redirected.stdout == str(attempt / "0" / "stdout.log") and redirected.stderr == str(attempt / "0" / "stderr.log")
    assert not redirected.console_out and not redirected.console_err
    assert redirected.error_file == str(attempt / "0" / "error.json")
    teed = procgroup.log_files(str(attempt), 1, 0, {1: 1})
    assert teed.stdout == str(attempt / "1" / "stdout.log") and teed.stderr is None
    assert teed.console_out and teed.console_err
    nothing = procgroup.log_files(str(attempt), 2, {0: 3}, {1: 3})
    assert (nothing.stdout, nothing.stderr, nothing.console_out) == (None, None, True)
    assert sorted(os.listdir(attempt)) == ["0", "1", "2"]


def test_return_codes_read_as_torchrun_prints_them():
    assert procgroup.describe_returncode(-signal.SIGKILL) == "-9 (SIGKILL)"
    assert procgroup.describe_returncode(3) == "3" and procgroup.describe_returncode(None) == "-"
    assert procgroup.exit_code(-15) == 143 and procgroup.signal_name(0) is None


def test_a_failed_members_last_lines_are_read_before_its_failure_is_reported():
    """The failure's record is its last lines: what a process wrote just before it exited is read
    from its pipes before on_failure runs, even when the exit is seen before the output."""
    seen: list[list[str]] = []
    program = "import sys; print('step 1'); print('ValueError: bad batch', file=sys.stderr); sys.exit(7)"
    group = procgroup.ProcGroup([procgroup.ProcSpec(0, [sys.executable, "-c", program], dict(os.environ))],
                      lambda which, data: None, 1.0, on_failure=lambda proc: seen.append(list(proc.tail)))
    group.start()
    try:
        group.procs[0].popen.wait(30)  # exited; not one byte of its output read yet
        group.reap()
        assert seen == [["step 1", "ValueError: bad batch"]]
    finally:
        group.finish()
