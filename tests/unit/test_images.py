"""Checks of images/*.Dockerfile that need no Docker engine: pinned bases and packages, versions
inside pyproject's ranges, a non-root user, and COPY sources that exist."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted((ROOT / "images").glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped.

    `${NAME}` and `$NAME` of an ARG are replaced by its default: what a plain `docker build`
    without --build-arg uses (scripts/build-images.sh passes other bases and indexes here).
    """
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    args: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            rest = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                          lambda m: args.get(m.group(1) or m.group(2), m.group(0)), rest.strip())
            if word.upper() == "ARG" and "=" in rest:
                name, _, default = rest.partition("=")
                args[name] = default
            out.append((word.upper(), rest))
    return out


def pyproject_requirements() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs: dict[str, list[Requirement]] = {}
    for group in project.get("optional-dependencies", {}).values():
        for spec in group:
            req = Requirement(spec)
            reqs.setdefault(req.name.lower(), []).append(req)
    return reqs


def pip_pins(path: Path) -> dict[str, str]:
    """Every `pip install NAME==VERSION` of the file; fails on an unpinned package."""
    pins: dict[str, str] = {}
    for word, rest in instructions(path):
        if word != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            args = shlex.split(command)
            if args[:2] != ["pip", "install"]:
                continue
            skip = False
            for arg in args[2:]:
                if skip:
                    skip = False
                    continue
                if arg in ("--index-url", "--extra-index-url", "-i"):
                    skip = True
                    continue
                if arg.startswith("-") or arg == "." or arg.startswith(".["):
                    continue  # options, and the project itself (with extras)
                name, sep, version = arg.partition("==")
                assert sep, f"{path.name}: {arg!r} is not pinned with =="
                pins[name.lower()] = version
    return pins


def test_both_images_exist():
    assert [p.name for p in IMAGES] == ["operator.Dockerfile", "worker-cpu.Dockerfile"]


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.name)
def test_base_image_pinned_by_patch_version(path):
    froms = [rest for word, rest in instructions(path) if word == "FROM"]
    assert froms, f"{path.name}: no FROM"
    for ref in froms:
        image, _, tag = ref.split()[0].partition(":")
        assert image == "python", ref
        assert re.fullmatch(r"3\.11\.\d+-slim(-[a-z]+)?", tag), f"{ref}: pin python:3.11.N-slim..."


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.name)
def test_runs_as_non_root(path):
    users = [rest for word, rest in instructions(path) if word == "USER"]
    assert users, f"{path.name}: no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and user.isdigit() and int(user) > 0, users[-1]
    # The numeric user is created in the image, so tools that look it up find a name.
    runs = " ".join(rest for word, rest in instructions(path) if word == "RUN")
    assert f"--uid {user}" in runs


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.name)
def test_pinned_versions_inside_pyproject_ranges(path):
    pins = pip_pins(path)
    assert pins, f"{path.name}: installs no pinned package"
    ranges = pyproject_requirements()
    for name, version in pins.items():
        assert name in ranges, f"{path.name}: {name} is not a dependency in pyproject.toml"
        for req in ranges[name]:
            assert req.specifier.contains(Version(version)), f"{path.name}: {name}=={version} outside {req}"


def test_operator_image_has_the_operator_stack():
    pins = pip_pins(ROOT / "images/operator.Dockerfile")
    operator = {Requirement(r).name.lower() for r in tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["operator"]}
    # Every package of the operator extra pinned, and no client library: kopf would import one it
    # finds installed (its optional object support, ~19 MiB and half a second of start-up).
    assert set(pins) == operator
    assert not {"kubernetes", "kubernetes-asyncio", "pykube-ng"} & set(pins)
    entry = [rest for word, rest in instructions(ROOT / "images/operator.Dockerfile") if word == "ENTRYPOINT"]
    assert entry == ['["python", "-m", "spmd_operator"]']


def test_worker_image_uses_the_cpu_torch_wheel():
    path = ROOT / "images/worker-cpu.Dockerfile"
    assert pip_pins(path) == {"torch": "2.14.1", "torchft": "0.2.0"}  # torchft: replica groups' Lighthouse and Manager
    runs = [rest for word, rest in instructions(path) if word == "RUN" and "torch==" in rest]
    words = shlex.split(runs[0])
    assert words[words.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.name)
def test_copied_files_exist(path):
    copies = [rest for word, rest in instructions(path) if word in ("COPY", "ADD")]
    assert copies
    for rest in copies:
        args = [a for a in rest.split() if not a.startswith("--")]
        for src in args[:-1]:
            assert (ROOT / src).exists(), f"{path.name}: COPY source {src} missing from the build context"


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.name)
def test_project_installed_from_build_context(path):
    runs = [rest for word, rest in instructions(path) if word == "RUN"]
    assert any(re.search(r"pip install (--no-deps \.|\"\.\[operator\]\")(\s|$)", r) for r in runs)
    # What pyproject maps into the wheel is in the context.
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    copied = " ".join(rest for word, rest in instructions(path) if word == "COPY")
    for d in dirs:
        top = d.split("/")[0]
        assert re.search(rf"(^|\s){re.escape(top)}(\s|/)", copied), f"{path.name}: {top}/ is not copied"
