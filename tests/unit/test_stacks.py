"""The hang-blame rule (monarch_spmd.payload.stacks) from tables of real faulthandler dumps.

The dumps are what ``python -X faulthandler`` wrote on SIGABRT for ranks of
tests/programs/stuck_rank.py (and of a two-thread script calling ``work.wait()``) under a gloo
process group, with the virtualenv's path shortened and the extension-module list cut.
"""

from __future__ import annotations

import pytest

from monarch_spmd.payload import stacks

_TAIL = "\nExtension modules: numpy._core._multiarray_umath, torch._C (total: 21)\n"
_RUNPY = ('  File "/work/main/tests/programs/stuck_rank.py", line 66 in <module>\n'
          '  File "<frozen runpy>", line 88 in _run_code\n'
          '  File "<frozen runpy>", line 198 in _run_module_as_main\n')


def _dump(*frames: str, ident: str = "0x00007ff8d1dc9b80") -> str:
    return ("Fatal Python error: Aborted\n\n"
            f"Current thread {ident} (most recent call first):\n" + "".join(frames) + _RUNPY + _TAIL)


#: A rank waiting in all_reduce (stuck_rank.py's loop, line 57).
ALL_REDUCE = _dump(
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3913 in all_reduce\n',
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper\n',
    '  File "/work/main/tests/programs/stuck_rank.py", line 57 in main\n')
#: A rank in time.sleep (a C call: no frame of its own) at line 51.
SLEEP = _dump('  File "/work/main/tests/programs/stuck_rank.py", line 51 in main\n')
#: A rank in a busy loop in spin() (line 27).
SPIN = _dump('  File "/work/main/tests/programs/stuck_rank.py", line 27 in spin\n',
             '  File "/work/main/tests/programs/stuck_rank.py", line 53 in main\n')
#: A rank that left the loop early and waits in the final barrier (line 59).
BARRIER = _dump(
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 6371 in barrier\n',
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper\n',
    '  File "/work/main/tests/programs/stuck_rank.py", line 59 in main\n')
#: Two threads: a heartbeat thread, and the main thread in ``work.wait()`` (line 16) or in
#: time.sleep (line 14).
THREADS = """Fatal Python error: Aborted

Thread 0x00007f0bc93256c0 (most recent call first):
  File "/job/train.py", line 6 in heartbeat
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0c8b894b80 (most recent call first):
  File "/job/train.py", line {line} in main
  File "/job/train.py", line 18 in <module>
""" + _TAIL
WORK_WAIT, THREAD_SLEEP = THREADS.format(line=16), THREADS.format(line=14)
SOURCE = {("/job/train.py", 16): "    work.wait()\n", ("/job/train.py", 14): "        time.sleep(3600)\n"}
#: A dump taken while the interpreter collected garbage (a note line inside the thread).
GC = ("Fatal Python error: Aborted\n\nCurrent thread 0x00007fd16b211b80 (most recent call first):\n"
      "  Garbage-collecting\n"
      '  File "/venv/lib/python3.11/site-packages/torch/utils/_pytree.py", line 1477 in tree_flatten\n'
      '  File "/work/main/tests/programs/stuck_rank.py", line 38 in main\n' + _RUNPY + _TAIL)


def source(file: str, line: int) -> str:
    return SOURCE.get((file, line), "")


def test_a_dump_parses_into_threads_and_frames_innermost_first():
    stack = stacks.parse("[some output]\nstuck_rank rank 0 step 2\n" + ALL_REDUCE + "more output\n")
    assert stack is not None and len(stack.threads) == 1
    frames = stack.main.frames
    assert frames[0] == stacks.Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                                     3913, "all_reduce")
    assert [f.short() for f in frames[2:4]] == ["stuck_rank.py:57 in main", "stuck_rank.py:66 in <module>"]
    two = stacks.parse(WORK_WAIT)
    assert [t.current for t in two.threads] == [False, True]
    assert two.main.frames[0].function == "main", "the heartbeat thread is not the main one"
    assert stacks.parse(GC).main.frames[0].function == "tree_flatten"
    assert stacks.parse("no dump here\n") is None
    assert stacks.parse("Fatal Python error: Aborted\n\n") is None


@pytest.mark.parametrize("dump, state, operation, site", [
    (ALL_REDUCE, stacks.WAITING, "all_reduce", "stuck_rank.py:57 in main"),
    (BARRIER, stacks.WAITING, "barrier", "stuck_rank.py:59 in main"),
    (SLEEP, stacks.BUSY, "", "stuck_rank.py:51 in main"),
    (SPIN, stacks.BUSY, "", "stuck_rank.py:27 in spin"),
    (WORK_WAIT, stacks.WAITING, "wait", "train.py:16 in main"),
    (THREAD_SLEEP, stacks.BUSY, "", "train.py:14 in main"),
    (GC, stacks.BUSY, "", "stuck_rank.py:38 in main"),
])
def test_one_rank_is_waiting_or_busy(dump, state, operation, site):
    got = stacks.classify(3, stacks.parse(dump), source)
    assert (got.state, got.operation, got.site.short()) == (state, operation, site)


def test_a_rank_without_a_dump_shows_no_stack():
    assert stacks.classify(0, None).state == stacks.NO_STACK
    assert stacks.classify(0, stacks.parse("Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call "
                                           "first):\n  <no Python frame>\n")).state == stacks.NO_STACK


# (ranks' dumps, order (silent longest first), fallback) -> (named, decided, culprits, sentence)
CASES = [
    pytest.param({0: ALL_REDUCE, 1: SLEEP, 2: ALL_REDUCE}, [0, 2, 1], 0,
                 (1, True, (1,), "rank 1 is not in a collective (at stuck_rank.py:51 in main); "
                                 "ranks 0, 2 wait in all_reduce (at stuck_rank.py:57 in main)"), id="sleep"),
    pytest.param({0: ALL_REDUCE, 1: SPIN, 2: ALL_REDUCE}, [2, 0, 1], 2,
                 (1, True, (1,), "rank 1 is not in a collective (at stuck_rank.py:27 in spin); "
                                 "ranks 0, 2 wait in all_reduce (at stuck_rank.py:57 in main)"), id="spin"),
    pytest.param({0: ALL_REDUCE, 1: BARRIER, 2: ALL_REDUCE}, [1, 0, 2], 1,
                 (1, True, (1,), "rank 1 waits in barrier (at stuck_rank.py:59 in main), apart from its peers; "
                                 "ranks 0, 2 wait in all_reduce (at stuck_rank.py:57 in main)"), id="skip"),
    pytest.param({0: SLEEP, 1: SPIN, 2: ALL_REDUCE, 3: ALL_REDUCE}, [0, 1, 2, 3], 2,
                 (0, True, (0, 1), "ranks 0, 1 are not in a collective (rank 0 at stuck_rank.py:51 in main first); "
                                   "ranks 2, 3 wait in all_reduce (at stuck_rank.py:57 in main)"), id="two-busy"),
    pytest.param({0: WORK_WAIT, 1: THREAD_SLEEP}, [0, 1], 0,
                 (1, True, (1,), "rank 1 is not in a collective (at train.py:14 in main); "
                                 "rank 0 waits in wait (at train.py:16 in main)"), id="work-wait"),
    pytest.param({0: ALL_REDUCE, 1: ALL_REDUCE, 2: ALL_REDUCE}, [2, 1, 0], 2,
                 (2, False, (), "no rule named a culprit (every rank seen waits at one call site); "
                                "rank 2 went silent first, the likely one"), id="all-at-one-site"),
    pytest.param({0: ALL_REDUCE, 1: BARRIER}, [1, 0], 1,
                 (1, False, (), "no rule named a culprit (the ranks wait at different call sites, none shared by "
                                "the most); rank 1 went silent first, the likely one"), id="even-split"),
    pytest.param({0: SLEEP, 1: SPIN}, [0, 1], 0,
                 (0, False, (), "no rule named a culprit (no rank is in a collective); "
                                "rank 0 went silent first, the likely one"), id="all-busy"),
    pytest.param({0: None, 1: None}, [1, 0], 1,
                 (1, False, (), "no rule named a culprit (no rank showed a stack); "
                                "rank 1 went silent first, the likely one"), id="no-stacks"),
    # The waiting ranks went quiet first (as they entered the collective): the one that showed no
    # stack (stopped, killed) is the likely one, whoever went quiet first.
    pytest.param({0: ALL_REDUCE, 1: None, 2: ALL_REDUCE}, [0, 2, 1], 0,
                 (1, False, (), "no rule named a culprit (every rank with a stack waits at one call site; rank 1 "
                                "showed none); rank 1, which showed no stack, the likely one"), id="one-without-stack"),
    pytest.param({0: ALL_REDUCE, 1: None, 2: SLEEP}, [0, 1, 2], 0,
                 (2, True, (2,), "rank 2 is not in a collective (at stuck_rank.py:51 in main); "
                                 "rank 0 waits in all_reduce (at stuck_rank.py:57 in main)"),
                 id="busy-beside-no-stack"),
]


@pytest.mark.parametrize("dumps, order, fallback, expected", CASES)
def test_the_rule_names_the_culprit_or_says_it_cannot(dumps, order, fallback, expected):
    parsed = {rank: stacks.parse(text) if text else None for rank, text in dumps.items()}
    verdict = stacks.blame(parsed, order, fallback, "went silent first", source=source)
    assert (verdict.rank, verdict.decided, verdict.culprits, verdict.sentence) == expected


def test_without_detail_no_file_or_function_is_named():
    parsed = {0: stacks.parse(ALL_REDUCE), 1: stacks.parse(SLEEP), 2: stacks.parse(ALL_REDUCE)}
    verdict = stacks.blame(parsed, [0, 1, 2], 0, "went silent first", detail=False)
    assert verdict.sentence == "rank 1 is not in a collective; ranks 0, 2 wait in all_reduce"


def test_the_excerpt_is_the_innermost_frames_within_its_bound():
    parsed = {0: stacks.parse(ALL_REDUCE), 1: stacks.parse(SPIN)}
    verdict = stacks.blame(parsed, [0, 1], 0, "went silent first")
    assert verdict.excerpt() == ("stuck_rank.py:27 in spin < stuck_rank.py:53 in main < stuck_rank.py:66 in <module> "
                                 "< <frozen runpy>:88 in _run_code < <frozen runpy>:198 in _run_module_as_main")
    assert verdict.excerpt(60) == "stuck_rank.py:27 in spin < stuck_rank.py:53 in main"
    deep = _dump(*[f'  File "/job/train.py", line {n} in f{n}\n' for n in range(200)])
    long = stacks.blame({0: stacks.parse(deep), 1: stacks.parse(ALL_REDUCE)}, [0, 1], 0, "x")
    assert 0 < len(long.excerpt()) <= stacks.EXCERPT_CHARS
    assert stacks.blame({0: None}, [0], 0, "x").excerpt() == ""


@pytest.mark.parametrize("command, expected", [
    (["/usr/bin/python3", "-m", "train"], ["/usr/bin/python3", "-X", "faulthandler", "-m", "train"]),
    (["/venv/bin/python", "train.py", "-X", "y"], ["/venv/bin/python", "-X", "faulthandler", "train.py", "-X", "y"]),
    (["python3.11", "-u", "-X", "faulthandler", "t.py"], ["python3.11", "-u", "-X", "faulthandler", "t.py"]),
    (["/bin/bash", "run.sh"], ["/bin/bash", "run.sh"]),
    ([], []),
])
def test_faulthandler_goes_after_a_python_interpreter_only(command, expected):
    assert stacks.with_faulthandler(command) == expected
    assert stacks.dumps_stacks(stacks.with_faulthandler(command)) == (bool(command) and command[0] != "/bin/bash")


def test_an_option_of_the_program_is_not_the_interpreters():
    assert not stacks.dumps_stacks(["python3", "train.py", "-X", "faulthandler"])
    assert not stacks.dumps_stacks(["python3", "-m", "train", "-X", "faulthandler"])
    assert stacks.dumps_stacks(["python3", "-Xfaulthandler", "-m", "train"])


def test_the_sentence_stays_short_for_many_ranks_at_many_call_sites():
    many = {0: stacks.parse(SLEEP)}
    for rank in range(1, 100):
        many[rank] = stacks.parse(ALL_REDUCE.replace("line 57 in main", f"line {100 + rank} in main"))
    verdict = stacks.blame(many, list(range(100)), 5, "went silent first")
    assert verdict.rank == 0 and verdict.decided
    assert verdict.sentence.endswith("; 96 more groups of ranks wait elsewhere"), verdict.sentence
    assert len(verdict.sentence) < 400
