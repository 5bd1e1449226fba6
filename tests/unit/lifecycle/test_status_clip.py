"""A failure's last line in its one-line description (Conditions, Events): cut whole."""

from __future__ import annotations

from spmd_operator.lifecycle.status import clip

BLAME = ("rank 1 is not in a collective (at stuck_rank.py:68 in main); ranks 0, 2 wait in all_reduce (at "
         "stuck_rank.py:74 in main); rank 1 wrote nothing for 30s (progress timeout 30s); last line: stuck_rank "
         "rank 1 step 2; innermost frames of rank 1: stuck_rank.py:68 in main < stuck_rank.py:83 in <module> < "
         "<frozen runpy>:88 in _run_code < <frozen runpy>:198 in _run_module_as_main")


def test_a_short_line_is_kept_as_it_is():
    assert clip("RuntimeError: NCCL timeout", 300) == "RuntimeError: NCCL timeout"
    assert clip("x" * 300, 300) == "x" * 300


def test_a_long_line_is_cut_between_frames_or_clauses_never_inside_one():
    cut = clip(BLAME, 300)
    assert len(cut) <= 300 and cut.endswith(" ...")
    kept = cut[:-len(" ...")]
    assert BLAME.startswith(kept)
    assert BLAME[len(kept):].startswith(("; ", " < ")), "cut at a boundary"
    assert "rank 1 is not in a collective" in cut


def test_a_line_without_boundaries_is_cut_at_the_limit():
    cut = clip("y" * 1000, 300)
    assert cut == "y" * 296 + " ..." and len(cut) == 300
