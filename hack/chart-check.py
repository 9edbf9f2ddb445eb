"""`make chart-check`: the chart as a platform team meets it.

1. `helm lint --strict` with the documented values (and with every optional part on).
2. charts/corral/README.md is what hack/chart-readme.py generates from values.yaml.
3. checkov, a Kubernetes manifest scanner, over the rendered chart (both value sets) and over a
   sandbox pod as the operator's builder makes it (hack/render-sandbox-pod.py). Each finding
   must be accepted, by check id and resource, in hack/checkov-accepted.yaml, which says why
   (docs/security.md has the table); any other finding fails, and so does an accepted one
   that no longer occurs (the list cannot outlive its reasons).

Usage: .venv/bin/python hack/chart-check.py --checkov PATH [--helm PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "corral"
ACCEPTED = REPO / "hack" / "checkov-accepted.yaml"
NAMESPACE = "corral-system"

# What docs/operations.md tells a person to install with.
DOCUMENTED = ['watchNamespaces=["agents"]']
# Every optional part on, watching every namespace: the most the chart renders.
EVERYTHING = [
    "watchNamespaces=[]",
    'sandboxNamespaces=["agents", "team-b"]',
    'imagePullSecrets=[{"name": "regcred"}]',
    'sandbox.imagePullSecrets=[{"name": "regcred"}]',
    'memory.postgres={"deploy": true}',
    'metrics.serviceMonitor={"enabled": true}',
    'metrics.grafanaDashboard={"enabled": true}',
    'metrics.allowedFrom=[{"namespaceSelector": {"matchLabels": '
    '{"kubernetes.io/metadata.name": "monitoring"}}}]',
    'console.allowedFrom=[{"namespaceSelector": {"matchLabels": '
    '{"kubernetes.io/metadata.name": "ingress"}}}]',
    'archive.s3={"endpoint": "https://s3.example.com", "bucket": "corral-archive", '
    '"credentialsSecret": "archive-keys"}',
    'egressGateway.hosts={"artifacts.example": ["203.0.113.7"]}',
    'operator.priorityClassName="corral-critical"',
]


def _helm_args(values: list[str]) -> list[str]:
    args: list[str] = []
    for value in values:
        args += ["--set-json", value]
    return args


def _run(args: list[str], what: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"chart-check: {what} failed (exit {done.returncode}):\n"
                         f"{done.stdout}{done.stderr}")  # fmt: skip
    return done.stdout


def lint(helm: Path) -> None:
    for values in (DOCUMENTED, EVERYTHING):
        _run([str(helm), "lint", "--strict", str(CHART), *_helm_args(values)], "helm lint --strict")


def readme() -> None:
    _run([sys.executable, str(REPO / "hack" / "chart-readme.py"), "--check"], "chart README drift")


def render(helm: Path, into: Path) -> None:
    for name, values in (("documented", DOCUMENTED), ("everything", EVERYTHING)):
        text = _run(
            [str(helm), "template", "corral", str(CHART), "--namespace", NAMESPACE,
             *_helm_args(values)],
            f"helm template ({name} values)",
        )  # fmt: skip
        (into / f"chart-{name}.yaml").write_text(text)
    pod = _run([sys.executable, str(REPO / "hack" / "render-sandbox-pod.py")], "the sandbox pod")
    (into / "sandbox-pod.yaml").write_text(pod)


def scan(checkov: Path, directory: Path) -> set[tuple[str, str]]:
    """(check id, resource) of every failed check."""
    done = subprocess.run(
        [str(checkov), "--directory", str(directory), "--framework", "kubernetes",
         "--output", "json", "--quiet", "--compact", "--skip-download"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    # checkov exits 1 when a check fails: the JSON says which; anything else is checkov's error.
    if done.returncode not in (0, 1):
        raise SystemExit(f"chart-check: checkov failed (exit {done.returncode}):\n{done.stderr}")
    report: Any = json.loads(done.stdout) if done.stdout.strip() else {}
    reports = report if isinstance(report, list) else [report]
    failed: set[tuple[str, str]] = set()
    for one in reports:
        for check in one.get("results", {}).get("failed_checks", []):
            failed.add((check["check_id"], check["resource"]))
        if one.get("summary", {}).get("parsing_errors"):
            raise SystemExit(f"chart-check: checkov could not parse: {one['summary']}")
    return failed


def accepted() -> dict[tuple[str, str], str]:
    entries = yaml.safe_load(ACCEPTED.read_text()) or {}
    out: dict[tuple[str, str], str] = {}
    for check_id, entry in entries.items():
        for resource in entry["resources"]:
            out[(check_id, resource)] = entry["why"]
    return out


def judge(failed: set[tuple[str, str]], allowed: dict[tuple[str, str], str]) -> list[str]:
    problems = [
        f"new finding {check} on {resource}: fix it, or justify it in docs/security.md and "
        f"hack/checkov-accepted.yaml"
        for check, resource in sorted(failed - allowed.keys())
    ]
    problems += [
        f"accepted finding {check} on {resource} no longer occurs: drop it from "
        f"hack/checkov-accepted.yaml and docs/security.md"
        for check, resource in sorted(allowed.keys() - failed)
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkov", type=Path, required=True)
    parser.add_argument("--helm", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.helm is None:
        from corral_dev import controlplane

        args.helm = controlplane.binaries() / "helm"
    started = time.monotonic()
    lint(args.helm)
    readme()
    with tempfile.TemporaryDirectory(prefix="corral-chart-check-") as tmp:
        render(args.helm, Path(tmp))
        failed = scan(args.checkov, Path(tmp))
    problems = judge(failed, accepted())
    for problem in problems:
        print(f"chart-check: {problem}", file=sys.stderr)
    took = time.monotonic() - started
    print(f"chart-check: helm lint --strict, README, checkov: {len(failed)} findings, all "
          f"accepted ({took:.0f} s)" if not problems else
          f"chart-check: {len(problems)} problems ({took:.0f} s)")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
