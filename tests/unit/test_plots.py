"""The benchmarks' pictures: the reader of the tables the benchmarks print finds every table of
RESULTS.md with its numbers, each picture is drawn (a PNG), the peers side by side, and the same
tables rendered from a benchmark's JSON give the same numbers; a lost node's bars are its table's
medians, one that did not recover drawn hatched to the cap."""

from __future__ import annotations

import json
import struct

import pytest

from benchmarks import node_loss, operator_scale, plots

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def drawn(monkeypatch) -> list[dict]:
    """What each figure saved from now on drew: its bars (length, hatched), texts, systems and title."""
    seen: list[dict] = []
    save = plots._save

    def keep(fig, path):
        (ax,) = fig.axes
        seen.append({"bars": [(round(p.get_width(), 3), bool(p.get_hatch())) for p in ax.patches],
                     "texts": [t.get_text() for t in ax.texts], "title": ax.get_title(),
                     "systems": [t.get_text() for t in ax.get_yticklabels()], "path": path})
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return seen


#: Section 5 of RESULTS.md, as it records a lost node: bold medians, a peer that did not recover.
NODE_LOSS_MD = """\
## 5. A lost node (real nodes)

One of two real kubelet nodes frozen under each system's running 2-pod gloo job; seconds from the
freeze, medians.

| system | runs | job running again s | every rank training again s | on the loss |
|---|---|---|---|---|
| SPMDJob InPlace, `maxRestarts: 0` | 3 | **22.0** | **24.0** | `NodeLost` disruption, gang recreated |
| SPMDJob RecreatePods, `maxRestarts: 1` | 3 | 183.1 | 186.1 | gloo timeout, then the lost pod's replacement |
| JobSet v0.12.0, `maxRestarts: 1` | 2 | did not recover in 720 s | did not recover in 720 s | `Failed` at 67-75 s |

Command: `python -m benchmarks.node_loss --runs 3`.
"""


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
                                         ("76 + 116", 76.0), ("**11.0**", 11.0), ("did not recover in 720 s", None)])
def test_cells(cell, value):
    assert plots.number(cell) == value


def test_every_picture_is_drawn_with_the_peers(tmp_path):
    written = plots.draw(plots.tables_from_results(), tmp_path)
    assert sorted(p.name for p in written) == ["gang_restart.png", "launch_overhead.png", "node_loss.png",
                                               "operator_scale.png"]
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


def test_a_lost_node_is_drawn_with_its_tables_numbers(tmp_path, monkeypatch):
    seen = drawn(monkeypatch)
    tables = plots.read_tables(NODE_LOSS_MD, "RESULTS.md")
    assert [t.section for t in tables] == ["node_loss"] and not tables[0].loaded
    (path,) = plots.draw(tables, tmp_path)
    assert path.name == "node_loss.png" and png_size(path)[0] >= 800
    (figure,) = seen
    # A bar pair per system (running again, training again), in the table's order; the JobSet row
    # did not recover: hatched bars to the cap, labelled so.
    assert figure["bars"] == [(22.0, False), (24.0, False), (183.1, False), (186.1, False), (720.0, True),
                              (720.0, True)]
    assert figure["texts"] == ["22.0 s", "24.0 s", "183.1 s", "186.1 s", "did not recover in 720 s",
                               "did not recover in 720 s"]
    assert figure["systems"] == ["SPMDJob InPlace, maxRestarts: 0", "SPMDJob RecreatePods, maxRestarts: 1",
                                 "JobSet v0.12.0, maxRestarts: 1"]
    assert figure["title"] == "A frozen node: seconds until the job trains again (medians)"


def test_a_lost_nodes_json_gives_its_medians(tmp_path, monkeypatch):
    def row(system, run, running, training, failed=None):
        return {"system": system, "run": run, "lost_rank": 1, "lost_node": "real-node-1", "running_again_s": running,
                "training_again_s": training, "failed_s": failed, "cap_s": 720, "timeline": [], "node_timeline": [],
                "last": ""}

    result = {"machine": {"cpus": 2, "cpu_model": "x", "mem_gib": 1, "python": "3.11", "date": "d", "commit": "c"},
              "controller_manager_flags": [], "cap_s": 720, "errors": [],
              "rows": [row("inplace", 1, 21.0, 23.0), row("jobset", 1, None, None, failed=70.0),
                       row("inplace", 2, 23.0, 25.0), row("jobset", 2, None, None)]}
    (tmp_path / "node_loss.json").write_text(json.dumps(result))
    (table,) = plots.tables_from_json(tmp_path)
    assert table.section == "node_loss" and table.source == "node_loss.json:7"
    # The single runs are left out: the medians only.
    assert plots.node_loss_medians(table) == [(node_loss.LABELS["inplace"], ["22.0", "24.0"]),
                                              (node_loss.LABELS["jobset"], ["did not recover in 720 s"] * 2)]
    seen = drawn(monkeypatch)
    plots.node_loss_figure([table], tmp_path / "node_loss.png")
    assert seen[0]["bars"] == [(22.0, False), (24.0, False), (720.0, True), (720.0, True)]


def test_results_md_shows_every_picture_and_the_pictures_are_committed():
    text = plots.RESULTS.read_text()
    for name, _ in plots.FIGURES:
        assert f"](plots/{name}.png)" in text, name
        assert png_size(plots.PLOTS_DIR / f"{name}.png")[0] >= 800
