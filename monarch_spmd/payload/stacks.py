"""The Python stacks of a hung gang's ranks, and which rank to blame: THE statement of the rule.

Where it sits: in the payload (standard library only, shipped into pods), beside :mod:`.names`;
pure (no process, no file: a source line is read through a function the caller passes). The
agent (:mod:`.agent`, through :mod:`.hang`) starts every Python rank with ``-X faulthandler``
while a hang detector is armed (:func:`with_faulthandler`), and when a rank hangs (NoProgress,
WatchdogTimeout) sends SIGABRT to every rank of its round at once: Python's faulthandler writes
every thread's stack to the rank's stderr and the rank ends. This module reads those dumps
(:func:`parse`) and decides (:func:`blame`); docs/restart-in-place.md states the rule for users.

The rule (:func:`blame`), on the main thread of each rank's dump:

1. a rank is *waiting* when its stack is inside torch.distributed (a collective, a barrier, a
   store wait, a rendezvous: a frame of ``torch/distributed/``) or its innermost user frame's line
   calls ``.wait(`` (``work.wait()``, ``store.wait()``: C++ calls that show no frame of their own);
   a rank whose stack is not is *busy*; a rank without a dump shows *no stack*;
2. some ranks wait and some are busy: the busy ranks are the culprits (they never reached the
   collective their peers wait in);
3. every rank with a stack waits: the ranks whose innermost user frame (the call site below
   torch's frames) differs from the one most ranks share are the culprits (a rank that skipped a
   collective waits at another call site); no single call site shared by the most ranks (an even
   split), or all at one call site: undecided;
4. otherwise (no stacks, every rank busy): undecided.

Undecided because every rank with a stack waits at one call site while some showed none, the
failure names the first rank that showed none (it is not seen waiting; the waiting ones went quiet
first, as they entered the collective). Otherwise undecided, the failure names the fallback the caller gives (the rank that went silent first, or
the rank whose watchdog timer expired), saying that no rule decided and why. Among several
culprits the failure names the one the caller's order puts first (silent longest).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

#: The interpreter option that makes a rank dump every thread's stack on SIGABRT (and on a crash).
FAULTHANDLER: Final = ("-X", "faulthandler")
#: What a dump starts with (Python's faulthandler, on SIGABRT).
DUMP_START: Final = "Fatal Python error: Aborted"
#: The most bytes of a rank's stderr kept after it was sent SIGABRT (its dump is in its log whole).
CAPTURE_BYTES: Final = 256 * 1024
#: The most characters of frames a failure message carries (it travels to the coordinator, the
#: operator's status and Events, whose messages are bounded at 1024..2048 characters).
EXCERPT_CHARS: Final = 300
#: How many ranks a blame sentence lists by number before it says "and N more".
LIST_RANKS: Final = 8
#: How many groups of waiting ranks (by operation and call site) a blame sentence lists.
LIST_GROUPS: Final = 3

_THREAD: Final = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)\b.*\(most recent call first\):\s*$")
_FRAME: Final = re.compile(r'^\s+File "(.*)", line (\d+) in (.*?)\s*$')
_INTERPRETER: Final = re.compile(r"^python(\d+(\.\d+)?)?$")
#: A path of a library frame: torch, an installed package, the standard library, a frozen module.
_LIBRARY: Final = re.compile(r"(^<frozen |/site-packages/|/dist-packages/|/lib/python\d+(\.\d+)?/|/torch/)")
_DISTRIBUTED: Final = "/torch/distributed/"
_WAIT_CALL: Final = re.compile(r"\.wait\s*\(")
#: Names of torch.distributed's functions a rank waits in (the operation a sentence names).
OPERATIONS: Final = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "send", "recv", "batch_isend_irecv", "init_process_group", "new_group", "_store_based_barrier",
    "destroy_process_group",
})

WAITING: Final = "waiting"
BUSY: Final = "busy"
NO_STACK: Final = "no stack"


# --- the command line ------------------------------------------------------------------------------


def is_python(executable: str) -> bool:
    """Whether ``executable`` names a Python interpreter (``python``, ``python3``, ``python3.11``)."""
    return bool(_INTERPRETER.match(os.path.basename(executable)))


def with_faulthandler(command: Sequence[str]) -> list[str]:
    """``command`` with ``-X faulthandler`` after its interpreter, when it is a Python
    interpreter's and has no such option yet; any other command is returned as it is.

    The option changes neither ``sys.argv`` nor the environment; it shows only in
    ``sys.orig_argv`` and ``sys._xoptions`` (and children started with the interpreter's flags,
    as multiprocessing's spawn, get it too)."""
    out = list(command)
    if not out or not is_python(out[0]) or dumps_stacks(out):
        return out
    return [out[0], *FAULTHANDLER, *out[1:]]


def dumps_stacks(command: Sequence[str]) -> bool:
    """Whether ``command`` starts a Python interpreter with faulthandler on (a SIGABRT then dumps
    every thread's stack); not for a command that is not Python's (torchrun's --no-python)."""
    args = list(command)
    if not args or not is_python(args[0]):
        return False
    i = 1
    while i < len(args):
        arg = args[i]
        if arg == "-X":
            if args[i + 1:i + 2] == ["faulthandler"]:
                return True
            i += 2
            continue
        if arg == "-Xfaulthandler":
            return True
        if arg in ("-m", "-c") or not arg.startswith("-"):
            return False  # the program: what follows is its own
        i += 1
    return False


# --- the dumps -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One frame of a dump: its file, line and function."""

    file: str
    line: int
    function: str

    def short(self) -> str:
        """``train.py:42 in step``."""
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}"

    @property
    def library(self) -> bool:
        """Whether it is torch's, an installed package's or the standard library's."""
        return bool(_LIBRARY.search(self.file))


@dataclass(frozen=True)
class Thread:
    """One thread of a dump, its frames innermost first."""

    ident: str
    current: bool
    frames: tuple[Frame, ...]

    @property
    def main(self) -> bool:
        """Whether it looks like the main thread: not started by ``threading`` (whose threads'
        outermost frame is its ``_bootstrap``)."""
        if not self.frames:
            return False
        outer = self.frames[-1]
        return not (outer.function == "_bootstrap" and os.path.basename(outer.file) == "threading.py")


@dataclass(frozen=True)
class Stack:
    """A rank's dump: its threads, as faulthandler wrote them."""

    threads: tuple[Thread, ...]

    @property
    def main(self) -> Thread | None:
        """The main thread: the thread not started by ``threading`` (the one that handled the
        signal when several qualify), else the current one, else the first."""
        candidates = [t for t in self.threads if t.main]
        for t in candidates:
            if t.current:
                return t
        if candidates:
            return candidates[0]
        for t in self.threads:
            if t.current:
                return t
        return self.threads[0] if self.threads else None


def parse(text: str) -> Stack | None:
    """The last faulthandler dump in ``text`` (a rank's stderr), or None when there is none."""
    start = text.rfind(DUMP_START)
    if start < 0:
        return None
    threads: list[Thread] = []
    ident, current, frames = None, False, []
    for line in text[start:].splitlines()[1:]:
        header = _THREAD.match(line)
        if header:
            if ident is not None:
                threads.append(Thread(ident, current, tuple(frames)))
            ident, current, frames = header.group(2), header.group(1) == "Current thread", []
            continue
        frame = _FRAME.match(line)
        if frame:
            if ident is not None:
                frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
        elif not line.strip():
            if ident is not None:
                threads.append(Thread(ident, current, tuple(frames)))
            ident = None
        elif not line.startswith(" "):
            break  # "Extension modules: ...", or the rank's (or a child's) other output
        # else a note inside a thread ("  Garbage-collecting", "  <no Python frame>", "  ..."): skipped
    if ident is not None:
        threads.append(Thread(ident, current, tuple(frames)))
    return Stack(tuple(threads)) if threads else None


# --- one rank --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankState:
    """What a rank's stack says.

    Attributes:
        rank: the rank.
        state: WAITING, BUSY or NO_STACK.
        site: its innermost user frame (the call site below torch's frames), or its innermost
            frame when it has no user frame; None without a stack.
        operation: what it waits in (``all_reduce``, ``barrier``, ``wait``), for WAITING.
        frames: its main thread's frames, innermost first.
    """

    rank: int
    state: str
    site: Frame | None = None
    operation: str = ""
    frames: tuple[Frame, ...] = ()


def classify(rank: int, stack: Stack | None, source: Callable[[str, int], str] | None = None) -> RankState:
    """Rule 1 on one rank's dump; ``source(file, line)`` reads a source line (for ``.wait(``)."""
    thread = stack.main if stack is not None else None
    if thread is None or not thread.frames:
        return RankState(rank, NO_STACK)
    frames = thread.frames
    index = next((i for i, f in enumerate(frames) if not f.library), None)
    site = frames[index] if index is not None else frames[0]
    inner = frames[:index] if index is not None else frames
    distributed = [f for f in inner if _DISTRIBUTED in f.file]
    if distributed:
        named = [f.function for f in distributed if f.function in OPERATIONS]
        operation = named[0] if named else distributed[0].function
        return RankState(rank, WAITING, site, operation, frames)
    if index == 0 and source is not None:
        try:
            text = source(site.file, site.line) or ""
        except Exception:  # noqa: BLE001 - an unreadable source line only means no hint
            text = ""
        if _WAIT_CALL.search(text):
            return RankState(rank, WAITING, site, "wait", frames)
    return RankState(rank, BUSY, site, "", frames)


# --- the gang ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blame:
    """The rule's verdict on a hung round.

    Attributes:
        rank: the rank the failure names (the first culprit, or the fallback when undecided).
        decided: whether a rule decided (False: the fallback is only the likely one).
        culprits: every culprit, in the caller's order (empty when undecided).
        rule: which rule decided, or why none could (a few words).
        sentence: one line naming the culprit and its call site and what the others wait in.
        states: each rank's state.
    """

    rank: int
    decided: bool
    culprits: tuple[int, ...]
    rule: str
    sentence: str
    states: Mapping[int, RankState] = field(default_factory=dict)

    def excerpt(self, limit: int = EXCERPT_CHARS) -> str:
        """The named rank's innermost frames, ``a.py:3 in f < b.py:9 in main``, at most ``limit``
        characters (whole frames only); "" without a stack."""
        state = self.states.get(self.rank)
        if state is None:
            return ""
        out = ""
        for frame in state.frames:
            piece = frame.short() if not out else f" < {frame.short()}"
            if len(out) + len(piece) > limit:
                break
            out += piece
        return out


def ranks_words(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0, 2`` (``and N more`` past :data:`LIST_RANKS`)."""
    return _ranks(ranks)


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:LIST_RANKS])
    if len(ranks) > LIST_RANKS:
        shown += f" and {len(ranks) - LIST_RANKS} more"
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _at(state: RankState, detail: bool) -> str:
    return f" (at {state.site.short()})" if detail and state.site is not None else ""


def _waiters(states: Sequence[RankState], detail: bool) -> str:
    """``ranks 0, 2 wait in all_reduce (at train.py:30 in main)``, grouped by operation and site."""
    groups: dict[tuple[str, Frame | None], list[int]] = {}
    for s in states:
        groups.setdefault((s.operation, s.site if detail else None), []).append(s.rank)
    parts = []
    for (operation, _), ranks in groups.items():
        one = next(s for s in states if s.rank == ranks[0])
        parts.append(f"{_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {operation}{_at(one, detail)}")
    if len(parts) > LIST_GROUPS:
        parts[LIST_GROUPS:] = [f"{len(parts) - LIST_GROUPS} more groups of ranks wait elsewhere"]
    return "; ".join(parts)


def blame(stacks: Mapping[int, Stack | None], order: Sequence[int], fallback: int, fallback_why: str, *,
          source: Callable[[str, int], str] | None = None, detail: bool = True) -> Blame:
    """Rules 1-4 (module docstring) on the ranks' dumps.

    Args:
        stacks: each rank's dump (None: it showed none).
        order: the ranks, the one to name first among several culprits first (silent longest).
        fallback: the rank to name when no rule decides.
        fallback_why: what the fallback is, e.g. ``went silent first``.
        source: reads a source line (``source(file, line)``), for ``work.wait()``.
        detail: name call sites (False: ranks and operations only, no file or function).
    """
    return judge({r: classify(r, stack, source) for r, stack in stacks.items()}, order, fallback, fallback_why,
                 detail=detail)


def judge(states: Mapping[int, RankState], order: Sequence[int], fallback: int, fallback_why: str, *,
          detail: bool = True) -> Blame:
    """Rules 2-4 on the ranks' states (rule 1's :func:`classify` made them, on this machine or
    on the ranks' own: the coordinator judges a gang from every member's states, :func:`from_row`).
    The arguments are :func:`blame`'s."""
    position = {r: i for i, r in enumerate(order)}
    ranks = sorted(states, key=lambda r: (position.get(r, len(position)), r))
    states = {r: states[r] for r in ranks}
    waiting = [states[r] for r in ranks if states[r].state == WAITING]
    busy = [states[r] for r in ranks if states[r].state == BUSY]
    by_rank = lambda items: sorted(items, key=lambda s: s.rank)  # noqa: E731

    def undecided(why: str) -> Blame:
        sentence = f"no rule named a culprit ({why}); rank {fallback} {fallback_why}, the likely one"
        return Blame(fallback, False, (), why, sentence, states)

    if waiting and busy:
        first = busy[0]
        who = _ranks([s.rank for s in by_rank(busy)])
        if len(busy) == 1:
            sentence = f"{who} is not in a collective{_at(first, detail)}"
        else:
            where = f" at {first.site.short()}" if detail and first.site is not None else ""
            sentence = f"{who} are not in a collective (rank {first.rank}{where} first)"
        sentence += f"; {_waiters(by_rank(waiting), detail)}"
        return Blame(first.rank, True, tuple(s.rank for s in busy), "not in a collective", sentence, states)
    if waiting and not busy:
        sites = Counter((s.site.file, s.site.line) if s.site else None for s in waiting)
        ranked = sites.most_common()
        if len(ranked) == 1:
            unknown = [r for r in ranks if states[r].state == NO_STACK]
            if unknown:
                # Every rank that could show its stack waits in one collective: the one that could
                # not (stopped, killed, not Python) is the likely one, not the first to go quiet (a
                # waiting rank goes quiet as it enters the collective, before the culprit's last line).
                why = f"every rank with a stack waits at one call site; {_ranks(unknown)} showed none"
                likely = unknown[0]
                return Blame(likely, False, (), why,
                             f"no rule named a culprit ({why}); rank {likely}, which showed no stack, the likely one",
                             states)
            return undecided("every rank seen waits at one call site")
        if ranked[0][1] == ranked[1][1]:
            return undecided("the ranks wait at different call sites, none shared by the most")
        majority = ranked[0][0]
        odd = [s for s in waiting if (s.site.file, s.site.line) != majority]  # type: ignore[union-attr]
        rest = [s for s in waiting if (s.site.file, s.site.line) == majority]  # type: ignore[union-attr]
        first = odd[0]
        sentence = f"{_waiters(by_rank(odd), detail)}, apart from its peers; {_waiters(by_rank(rest), detail)}"
        return Blame(first.rank, True, tuple(s.rank for s in odd), "another call site", sentence, states)
    if busy:
        return undecided("no rank is in a collective")
    return undecided("no rank showed a stack")


def failure_message(verdict: Blame, own: str, detail: bool) -> str:
    """A hang's failure message: the verdict and the named rank's innermost frames when a rule
    decided; the detector's own words about the named rank (``own``) first otherwise, with the
    rule's words and frames when the rank showed a stack."""
    excerpt = verdict.excerpt() if detail else ""
    frames = f"; innermost frames of rank {verdict.rank}: {excerpt}" if excerpt else ""
    if verdict.decided:
        return f"{verdict.sentence}; {own}{frames}"
    state = verdict.states.get(verdict.rank)
    if state is None or state.state == NO_STACK:
        return own
    return f"{own}; {verdict.sentence}{frames}"


# --- states on the wire (a member's ``stacks`` message, docs/restart-in-place.md) ------------------

#: Frames of a rank's main thread a ``stacks`` row carries, innermost first, at most.
ROW_FRAMES: Final = 12
#: A frame's file name and function name on the wire, in characters, at most.
ROW_FILE: Final = 512
ROW_FUNCTION: Final = 128
STATES: Final = (WAITING, BUSY, NO_STACK)


def _frame_row(frame: Frame) -> list[object]:
    return [frame.file[-ROW_FILE:], frame.line, frame.function[:ROW_FUNCTION]]


def to_row(state: RankState) -> dict[str, object]:
    """``state`` as a ``stacks`` row carries it (bounded: :data:`ROW_FRAMES` frames). The site
    travels whole even when it is deeper than the frames kept (rule 3 compares sites)."""
    return {"rank": state.rank, "state": state.state, "operation": state.operation[:ROW_FUNCTION],
            "site": _frame_row(state.site) if state.site is not None else None,
            "frames": [_frame_row(f) for f in state.frames[:ROW_FRAMES]]}


def frame_from_row(value: object) -> Frame:
    """A frame from its row (``[file, line, function]``); raises ValueError naming what is wrong."""
    if (not isinstance(value, list) or len(value) != 3 or not isinstance(value[0], str)
            or not isinstance(value[1], int) or isinstance(value[1], bool) or not isinstance(value[2], str)
            or len(value[0]) > ROW_FILE or len(value[2]) > ROW_FUNCTION or not 0 <= value[1] < 1 << 31):
        raise ValueError(f"expected [file (at most {ROW_FILE} characters), line (0..2^31), function (at most "
                         f"{ROW_FUNCTION} characters)], got {str(value)[:80]!r}")
    return Frame(value[0], value[1], value[2])


def from_row(rank: int, row: Mapping[str, object]) -> RankState:
    """A rank's state from a ``stacks`` row; raises ValueError naming the field that is wrong."""
    state = row.get("state")
    if state not in STATES:
        raise ValueError(f"state: {str(state)[:40]!r} is not valid; expected one of {', '.join(STATES)}")
    operation = row.get("operation", "")
    if not isinstance(operation, str) or len(operation) > ROW_FUNCTION:
        raise ValueError(f"operation: expected a string of at most {ROW_FUNCTION} characters")
    site = row.get("site")
    frames = row.get("frames", [])
    if not isinstance(frames, list) or len(frames) > ROW_FRAMES:
        raise ValueError(f"frames: expected a list of at most {ROW_FRAMES} frames")
    try:
        site_frame = frame_from_row(site) if site is not None else None
    except ValueError as e:
        raise ValueError(f"site: {e}") from None
    parsed = []
    for i, f in enumerate(frames):
        try:
            parsed.append(frame_from_row(f))
        except ValueError as e:
            raise ValueError(f"frames[{i}]: {e}") from None
    if state == NO_STACK:
        return RankState(rank, NO_STACK)
    if site_frame is None:
        raise ValueError(f"site: a rank in state {state} has a call site")
    return RankState(rank, str(state), site_frame, operation, tuple(parsed))
