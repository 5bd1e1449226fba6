"""The README's claims, checked: every command block that needs no cluster is run as a user would
run it (and the output it shows must appear), every command line names options its command has,
the names it shows are the names the code makes, and every link leads somewhere.

A block that cannot run here says why in a comment right above it
(``<!-- readme-test: skip (needs a cluster) -->``); a ``text`` block right after a command block is
that block's expected output (each of its lines must appear in what the commands printed).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from monarch_spmd import cli, logs, podview, status, torchrun, validate
from spmd_operator import names
from spmd_operator.names import JobRef

from .conftest import ROOT

README = ROOT / "README.md"
#: The pages of docs/ the README leads to whose commands and names are checked here too.
DOCS = ("cli.md", "torchrun.md", "spmdjob.md", "gpu.md", "library.md", "operating.md", "troubleshooting.md",
        "development.md", "monarch-on-kubernetes.md")
SKIP = re.compile(r"<!-- readme-test: skip \((?P<why>[^)]+)\) -->")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```\n", re.M | re.S)


@dataclass
class Block:
    lang: str
    body: str
    skip: str | None
    expected: str | None
    line: int
    start: int
    end: int


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found: list[Block] = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.fullmatch(before.strip())
        block = Block(m.group("lang"), m.group("body"), skip.group("why") if skip else None, None,
                      text[:m.start()].count("\n") + 1, m.start(), m.end())
        if found and block.lang == "text" and found[-1].lang == "sh" and not text[found[-1].end:block.start].strip():
            found[-1].expected = block.body
        found.append(block)
    return found


def shell_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.lang == "sh"]


def runnable() -> list[Block]:
    return [b for b in shell_blocks(README) if b.skip is None]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A fresh folder with the repository's examples, as a checkout's root looks to a user (the
    commands' own files land here, not in the repository)."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "examples").symlink_to(ROOT / "examples")
    return folder


@pytest.mark.parametrize("block", runnable(), ids=lambda b: f"README.md:{b.line}")
def test_each_command_block_runs_and_prints_what_the_readme_shows(block, workdir):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.body], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"README.md:{block.line}\n{block.body}\n{output}"
    printed = {" ".join(line.split()) for line in output.splitlines()}
    for line in (block.expected or "").splitlines():
        if line.strip() and line.strip() != "...":
            assert " ".join(line.split()) in printed, f"README.md:{block.line} shows {line!r}; it printed:\n{output}"


def test_the_readme_runs_something_and_says_why_it_skips_the_rest():
    shells = shell_blocks(README)
    assert len(runnable()) >= 3, "the laptop commands run here"
    assert all(b.skip.strip() for b in shells if b.skip is not None)
    skipped = [b.skip for b in shells if b.skip]
    assert set(skipped) <= {"needs a cluster", "needs the network", "the test suite itself",
                            "needs root, Go and the network"}, skipped
    assert len(README.read_text().splitlines()) < 250


def _commands(path: Path) -> list[list[str]]:
    """Every ``monarch-spmd CMD ...`` and ``kubectl spmd CMD ...`` of a page's shell blocks, cut at
    a comment, a pipe, a redirection or ``&&``."""
    out: list[list[str]] = []
    for block in shell_blocks(path):
        text = block.body.replace("\\\n", " ")
        for line in text.splitlines():
            for m in re.finditer(r"(?:^|[\s(])(?:monarch-spmd|kubectl spmd) (\w+)(?=\s|$)(.*)", line):
                rest = re.split(r"\s#|\s\||\s>|&&|\)\"?$", m.group(2))[0]
                if "[" in rest or "..." in rest or "|" in rest:  # a usage line, not a command
                    continue
                out.append([m.group(1), *shlex.split(rest)])
    return out


def _check_command(words: list[str]) -> None:
    command, args = words[0], words[1:]
    if command == "status":
        status.parse_args(args)
    elif command == "logs":
        logs.parse_args(args)
    elif command == "validate":
        validate.build_parser().parse_args(args)
    elif command == "manifest":
        parser = cli._manifest_parser()
        own, _ = torchrun.split_options(args, parser)
        parser.parse_args(own)
    elif command == "run":
        parser = cli._run_parser()
        own, _ = torchrun.split_options(args, parser)
        parser.parse_args(own)
    elif command == "pods":
        podview.parser().parse_args(args)
    else:
        assert command in ("worker",), f"unknown command {command}"


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{d}" for d in DOCS)])
def test_every_command_line_shown_names_options_its_command_has(page):
    commands = _commands(ROOT / page)
    for words in commands:
        try:
            _check_command(words)
        except SystemExit as e:
            pytest.fail(f"{page}: monarch-spmd {' '.join(words)}: refused by its parser (exit {e.code})")


def test_the_names_shown_are_the_names_the_operator_makes():
    job = JobRef(name="JOB", namespace="NS", uid="abcdef01-2345")

    def shown(value: str) -> str:
        return (value.replace("JOB", "<job>").replace(names.job_id(job.uid), "<id>").replace("NS", "<namespace>")
                .replace("7", "<attempt>").replace("9", "<index>"))

    readme = README.read_text()
    for made in (names.pod_name(job, 7, 9), names.service_name(job, 7), names.master_addr(job, 7)):
        assert f"`{shown(made)}`" in readme, shown(made)
    assert f"`{names.payload_configmap_name('<hash>')}`" in readme
    pages = [README, *(ROOT / "docs" / d for d in DOCS), ROOT / "docs" / "interfaces.md",
             ROOT / "crds" / "spmd.monarch.dev_spmdjobs.yaml", ROOT / "helm" / "monarch-spmd" / "README.md"]
    for page in pages:
        assert not re.search(r"<(job|name)>-master", page.read_text()), f"{page}: the master Service is <job>-<id>-m<N>"


def test_the_columns_shown_are_the_columns_printed():
    crd = yaml.safe_load((ROOT / "crds" / "spmd.monarch.dev_spmdjobs.yaml").read_text())
    columns = [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
               if not c.get("priority")]
    shown = re.search(r"kubectl get spmdjob +# (.*)", README.read_text()).group(1).split()
    assert shown == ["NAME", *columns]
    cli_page = (ROOT / "docs" / "cli.md").read_text()
    header = next(line for line in cli_page.splitlines() if line.startswith("NAME "))
    assert header.split() == list(status.HEADERS)
    table = next(line for line in cli_page.splitlines() if line.strip().startswith("RANK "))
    assert table.split() == ["RANK", "LOCAL_RANK", "POD", "NODE", "EXIT", "CODE", "REASON"]


def test_installs_name_extras_that_exist_and_the_python_it_needs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = README.read_text()
    for names_ in re.findall(r'pip install -e "\.\[([\w,]+)\]"', readme):
        assert set(names_.split(",")) <= set(extras), names_
    assert "Python 3.11" in readme and "3.10+" not in readme
    assert any("torchmonarch" in dep and "0.7" in dep for dep in extras["monarch"])


LINK = re.compile(r"\]\(([^)#\s]+)?(?:#([^)\s]+))?\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{d}" for d in DOCS)])
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    source = ROOT / page
    text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.M | re.S)
    for target, anchor in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path = (source.parent / target).resolve() if target else source
        assert path.exists(), f"{page}: link to {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page}: no heading #{anchor} in {target or page}"


def test_the_security_model_is_written_where_people_look_and_names_every_rbac_resource():
    readme = README.read_text()
    section = readme.split("## Security", 1)[1]
    notes = (ROOT / "helm" / "monarch-spmd" / "templates" / "NOTES.txt").read_text()
    assert "Creating an SPMDJob is creating pods" in section and "Pod Security admission" in section
    assert "creating an SPMDJob is creating pods" in notes and "Pod Security admission" in notes
    assert "status.failure.message" in section and "status.failure.message" in notes
    rbac = (ROOT / "helm" / "monarch-spmd" / "templates" / "rbac.yaml").read_text()
    resources = set(re.findall(r'resources: \["([\w/]+)"\]', rbac))
    said = {"spmdjobs": "SPMDJobs", "spmdjobs/status": "status", "pods": "pods", "services": "Services",
            "configmaps": "ConfigMaps", "events": "Events", "customresourcedefinitions": "CRDs",
            "namespaces": "namespaces", "leases": "Lease", "workloads": "Workloads", "workloads/status": "Workloads",
            "podgroups": "PodGroups", "resourceflavors": "Kueue", "networkpolicies": "NetworkPolicies"}
    assert resources <= set(said), f"rbac.yaml has new resources: {resources - set(said)}; say what they allow"
    for resource in resources:
        assert said[resource] in section, resource
    (events,) = re.findall(r'resources: \["events"\]\n\s+verbs: \[(.*)\]', rbac)
    verbs = [v.strip().strip('"') for v in events.split(",")]
    assert f"{' and '.join(verbs)} Events" in section, verbs
