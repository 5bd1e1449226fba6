"""The benchmarks' pictures: the reader of the tables the benchmarks print finds every table of
RESULTS.md with its numbers, each picture is drawn (a PNG), the peers side by side, and the same
tables rendered from a benchmark's JSON give the same numbers."""

from __future__ import annotations

import struct

import pytest

from benchmarks import operator_scale, plots

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_results_md_tables_are_read_with_their_numbers():
    tables = plots.tables_from_results()
    sections = [t.section for t in tables]
    assert {"launch_overhead", "operator_scale", "gang_restart"} <= set(sections)
    record, table = plots.newest(tables, "operator_scale", "spmdjob", 1024)
    assert not table.loaded and plots.number(record["job Running s"]) > 0
    _, jobset = plots.newest(tables, "operator_scale", "jobset", 4096)
    assert plots.floor_of(jobset, 4096) is not None, "a ratio needs the floor of the same run"
    assert [t.loaded for t in tables if t.section == "operator_scale"].count(True) >= 1  # the loaded four-actor run


@pytest.mark.parametrize("cell, value", [("18.65 (1.01x)", 18.65), ("1,033", 1033.0), ("-", None), ("", None),
                                         ("76 + 116", 76.0)])
def test_cells(cell, value):
    assert plots.number(cell) == value


def test_every_picture_is_drawn_with_the_peers(tmp_path):
    written = plots.draw(plots.tables_from_results(), tmp_path)
    assert sorted(p.name for p in written) == ["gang_restart.png", "launch_overhead.png", "operator_scale.png"]
    for path in written:
        width, height = png_size(path)
        assert width >= 800 and height >= 200
    tables = plots.tables_from_results()
    for actor, _, _ in plots.PEERS:  # each peer has a bar at both sizes
        for procs in plots.SIZES:
            assert plots.newest(tables, "operator_scale", actor, procs) is not None, (actor, procs)


def test_a_benchmarks_json_gives_the_same_table(tmp_path):
    row = {"procs": 1024, "actor": "spmdjob", "created_s": 3.63, "created_vs_floor": 1.46, "running_s": 18.61,
           "running_vs_floor": 1.0, "phase_running_s": 18.65, "phase_running_vs_floor": 1.01, "api_requests": 1033,
           "requests_vs_floor": 1.01, "peak_rss_mib": 71, "ok_reps": 1, "reps": 1}
    floor = {**row, "actor": "floor", "created_s": 2.49, "running_s": 18.52, "phase_running_s": None,
             "api_requests": 1024, "peak_rss_mib": 85}
    result = {"machine": {"cpus": 2, "cpu_model": "x", "mem_gib": 1, "python": "3.11", "date": "d"},
              "params": {"reps": 1}, "results": [floor, row]}
    (tables,) = [plots.read_tables(operator_scale.render(result), "json")]
    (table,) = tables
    record = table.records[1]
    assert (record["actor"], plots.number(record["job Running s"]), plots.number(record["API requests"])) == (
        "spmdjob", 18.65, 1033.0)
    assert plots.operator_scale_figure(tables, tmp_path / "one.png").exists()


def test_results_md_shows_every_picture_and_the_pictures_are_committed():
    text = plots.RESULTS.read_text()
    for name, _ in plots.FIGURES:
        assert f"](plots/{name}.png)" in text, name
        assert png_size(plots.PLOTS_DIR / f"{name}.png")[0] >= 800
