"""Writes the SPMDJob CustomResourceDefinition from the one table in :mod:`monarch_spmd.spec`, with
Kubernetes' own PodTemplateSpec schema under ``spec.template`` (:mod:`monarch_spmd.podtemplate`).

Where it sits: a tool beside the library (it needs PyYAML, so nothing imports it at run time).
``crds/spmd.monarch.dev_spmdjobs.yaml`` is its output, committed; ``tests/unit/test_crd.py`` fails
when the committed file differs from what the table generates. Regenerate (and copy into the Helm
chart) with::

    bash scripts/gen-crd.sh            # = python -m monarch_spmd.crd > crds/...; scripts/sync-crd.sh

Usage: ``python -m monarch_spmd.crd`` prints the CRD; ``--check FILE`` exits 1 when FILE differs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from . import podspec_openapi, podtemplate, spec


HEADER: Final = """\
# GENERATED from the SPMDJob table in monarch_spmd/spec.py: do not edit by hand. To change a field,
# change its entry there and run `bash scripts/gen-crd.sh` (python -m monarch_spmd.crd, then
# scripts/sync-crd.sh for the Helm chart's copy); tests/unit/test_crd.py fails when this file and
# the table differ.
# Under spec.template: Kubernetes {version}'s PodTemplateSpec schema, every field typed, generated
# from Kubernetes' OpenAPI (monarch_spmd/podtemplate.py, monarch_spmd/podspec_openapi.py), so that
# an unknown field there (a typo) is refused, not dropped. Install and upgrade it with
# `kubectl apply --server-side` (or kubectl create/replace): client-side apply would copy it into
# its last-applied annotation, which may hold 256 KiB and which it would nearly fill.
# The SPMDJob CustomResourceDefinition. `kubectl explain spmdjob.spec` prints the descriptions below,
# so they are the manual. The API server refuses bad input here (schema + CEL rules, messages
# naming the field), and monarch_spmd.spec checks a manifest with the same table offline
# (`monarch-spmd validate`, the local runner, the operator).
"""


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{spec.PLURAL}.{spec.GROUP}",
            "labels": {"app.kubernetes.io/name": "monarch-spmd", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "listKind": f"{spec.KIND}List",
                "plural": spec.PLURAL,
                "singular": spec.KIND.lower(),
                "shortNames": list(spec.SHORT_NAMES),
            },
            "versions": [
                {
                    "name": spec.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in spec.PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": podtemplate.with_template(spec.ROOT).openapi()},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style, long prose folded at 100 columns, keys in the table's order."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = ">" if len(text) > 80 and " " in text and "\n" not in text and text == text.strip() else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    """The CRD file's text: the header, then the YAML."""
    body = yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False, allow_unicode=True)
    return HEADER.replace("{version}", podspec_openapi.KUBERNETES_VERSION) + body


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stdout.write(render())
        return 0
    if len(args) == 2 and args[0] == "--check":
        path = Path(args[1])
        if path.is_file() and path.read_text(encoding="utf-8") == render():
            print(f"{path}: up to date")
            return 0
        print(f"{path}: differs from the table in monarch_spmd/spec.py; run bash scripts/gen-crd.sh", file=sys.stderr)
        return 1
    print("usage: python -m monarch_spmd.crd [--check FILE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
