"""A helm post-renderer that gives the chart's operator more arguments: the development flags
the chart has no value for (`--local-repo-root` for `make dev-cluster NODE=real`).

helm pipes the rendered manifests in and applies what comes out:

    helm upgrade --install ... --post-renderer PYTHON \\
        --post-renderer-args=-m --post-renderer-args=corral_dev._helm_postrender \\
        --post-renderer-args=--operator-arg=--local-repo-root=git://HOST:PORT/
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

OPERATOR_CONTAINER = "operator"


def with_operator_args(docs: list[Any], extra: list[str]) -> list[Any]:
    """`docs` with `extra` appended to the operator container's args; SystemExit when there is
    no such container (a chart change must not make the flags vanish unnoticed)."""
    found = False
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"].get("containers", []):
            if container.get("name") == OPERATOR_CONTAINER:
                container.setdefault("args", []).extend(extra)
                found = True
    if not found:
        raise SystemExit(f"post-render: no Deployment has a container {OPERATOR_CONTAINER!r}")
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral_dev._helm_postrender")
    parser.add_argument("--operator-arg", action="append", default=[], metavar="ARG")
    args = parser.parse_args(argv)
    docs = [doc for doc in yaml.safe_load_all(sys.stdin) if doc is not None]
    yaml.safe_dump_all(with_operator_args(docs, args.operator_arg), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
