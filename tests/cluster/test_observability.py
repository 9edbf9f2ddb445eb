"""Seeing the fleet from the operator (docs/observability.md), on the real API server.

One Session runs through the operator as the chart runs it (`--metrics-addr`, `--log-format
json`, the model catalog ConfigMap giving the scripted model a price): its turn asks a person
(`git merge`), a person approves with `corral approve`, it succeeds, and a landing Approval makes
the operator run an Evidence check for it. Along the way `/metrics` is scraped with real HTTP
GETs, `kubectl`'s Events tell the story once, and the operator's, harness's and custodian's log
lines are JSON carrying the run id. A restarted operator repeats no Event and counts no spending
twice. The chart renders the metrics Service, ServiceMonitor and dashboard on request.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from corral_dev import controlplane, stack
from tests._objects import approval

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)
from .test_approvals_end_to_end import People, corral, people  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(240)

# The scripted model is free in the shipped catalog; the platform's overlay prices it.
PRICED = {"name": "corral-scripted", "prices": {"input": 3, "output": 15}}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    answer = httpx.get(url, timeout=10)
    answer.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the series of `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and wanted <= set(lbl))


def waited(op: OperatorHandle, what: str, url: str, holds: Callable[[Samples], bool]) -> Samples:
    """The first scrape of `url` that `holds`; on a timeout, what the last one and the operator
    said."""
    try:
        return wait_for(what, lambda: scraped_when(url, holds))
    except AssertionError as err:
        text = httpx.get(url, timeout=10).text
        shown = "\n".join(line for line in text.splitlines() if line.startswith("corral_"))
        raise AssertionError(f"{err}\n{shown}\n--- operator log\n{op.logs()[-6000:]}") from None


def scraped_when(url: str, holds: Callable[[Samples], bool]) -> Samples | None:
    """A scrape of `url` if `holds` says it shows what is awaited, else None (ask again)."""
    samples = scrape(url)
    return samples if holds(samples) else None


def _restart(op: OperatorHandle) -> int:
    """Stop and start the operator; the length its log had when it started again."""
    op.stop()
    started = len(op.logs())
    op.start()
    health = op.args[op.args.index("--liveness") + 1]
    stack.wait_serving("the operator", health, op.process, op.log)
    return started


def _pending(op: OperatorHandle) -> int:
    """The namespace's Approvals nobody decided, as the API server has them (the `people`
    fixture's probes of the admission policy among them)."""
    found = json.loads(op.cp.kubectl("get", "approvals", "-n", op.namespace, "-o", "json").stdout)
    return sum(
        (a.get("status") or {}).get("decision", "Pending") == "Pending" for a in found["items"]
    )


def _head(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line parsed as JSON; a line that is not JSON fails the test, named."""
    lines = []
    for line in text.splitlines():
        if line.strip():
            try:
                lines.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not a JSON log line: {line!r}") from None
    return lines


def test_metrics_events_and_json_logs_tell_a_sessions_story(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
    people: People,  # noqa: F811 - the fixture imported above
) -> None:
    ns = operator.namespace
    name = f"{ns}-seen"
    operator.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "corral-model-catalog"},
            "data": {"models.json": json.dumps({"models": [PRICED]})},
        }
    )
    port = controlplane.free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    operator.args += ["--metrics-addr", f"127.0.0.1:{port}", "--log-format", "json"]
    operator.args += ["--model-catalog-configmap", "corral-model-catalog"]
    json_from = _restart(operator)  # the lines before were the fixture's text ones

    merge = {"command": "git merge --ff-only main && echo MERGED"}
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"text": "Merging main.", "tool_use": {"name": "bash", "input": merge}},
                    {
                        "when": {"tool_result_contains": "MERGED"},
                        "text": "Merged.",
                        "otherwise": {"text": "Not merged."},
                    },
                ]
            }
        }
    )
    check = {"name": "unit", "command": "test -f README.md"}
    operator.apply(agent_doc(), session_doc(name, git_repo, landing={"check": check}))

    # ---- while a person is asked: the gauges say so.
    operator.wait_phase(name, {"WaitingForHuman"})
    waiting = waited(
        operator,
        "the pending approval in /metrics",
        metrics_url,
        lambda s: value(s, "corral_approvals_pending", namespace=ns) == _pending(operator),
    )
    assert value(waiting, "corral_approvals_pending", namespace=ns) >= 1  # the merge's, too
    assert value(waiting, "corral_sessions", namespace=ns, phase="WaitingForHuman") == 1
    assert value(waiting, "corral_sessions", namespace=ns, phase="Running") == 0
    approvals = json.loads(operator.cp.kubectl("get", "approvals", "-n", ns, "-o", "json").stdout)[
        "items"
    ]
    (asked,) = [a for a in approvals if a["spec"]["sessionRef"]["name"] == name]
    approved = corral("approve", asked["metadata"]["name"], kubeconfig=people.alice, namespace=ns)
    assert approved.returncode == 0, approved.stderr
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["usage"]["cost"] > 0, status["usage"]  # priced by the overlay

    # ---- a landing Approval: the operator runs the check; its verdict reaches the Session.
    uid = operator.get("session", name)["metadata"]["uid"]  # type: ignore[index]
    revision = _head(git_repo)
    operator.apply(
        approval(f"{name}-land", name, uid, revision=revision, reason=f"land {revision} on main")
    )

    def reasons() -> list[str]:
        return [e["reason"] for e in operator.events(name)]

    wait_for("the verdict on the Session", lambda: "EvidencePass" in reasons(), 120)

    # ---- /metrics after the run: every series, non-zero where the Session ran.
    after = scrape(metrics_url)
    assert value(after, "corral_sessions", namespace=ns, phase="Succeeded") == 1
    assert value(after, "corral_sessions", namespace=ns, phase="WaitingForHuman") == 0
    settled = value(
        after, "corral_turn_settlements_total", namespace=ns, agent="coder", status="completed"
    )
    assert settled >= 1
    assert value(after, "corral_reconcile_duration_seconds_count", kind="Session") > 0
    assert value(after, "corral_admission_duration_seconds_count", namespace=ns) >= 1
    # The write slots are exported; with the run over, nothing waits for one.
    assert ("corral_api_writes_in_flight", ()) in after
    assert value(after, "corral_api_writes_waiting") == 0
    assert value(after, "corral_session_first_turn_seconds_count", namespace=ns) == 1
    tokens = value(after, "corral_tokens_total", namespace=ns, agent="coder", kind="output")
    assert tokens == status["usage"]["outputTokens"] > 0
    cost = value(after, "corral_cost_usd_total", namespace=ns, agent="coder")
    assert cost == pytest.approx(status["usage"]["cost"])
    assert value(after, "corral_sandbox_pods_started_total", namespace=ns, source="cold") == 1
    # The merge Approval is decided; the landing one waits for a person.
    assert value(after, "corral_approvals_pending", namespace=ns) == _pending(operator)

    # ---- `kubectl describe session` tells the story, each part once.
    wait_for("the sandbox's release", lambda: "SandboxReleased" in reasons())
    told = Counter(reasons())
    for reason in (
        "PhaseRunning",
        "PhaseWaitingForHuman",
        "ApprovalRequested",
        "ApprovalApproved",
        "TurnAdmitted",
        "TurnSettled",
        "PhaseSucceeded",
        "EvidencePass",
        "SandboxReleased",
    ):
        assert told[reason] >= 1, (reason, told)
    assert told["ApprovalRequested"] == 2, told  # the merge, then the land
    assert told["ApprovalApproved"] == 1 and told["PhaseSucceeded"] == 1, told
    assert told["TurnSettled"] == status["turns"] and told["EvidencePass"] == 1, told
    described = operator.cp.kubectl("describe", "session", name, "-n", ns).stdout
    assert "ApprovalApproved" in described and "EvidencePass" in described

    # ---- JSON log lines with the run id, from all three processes.
    run_id = f"{name}.1"
    lines = _json_lines(operator.logs()[json_from:])
    ours = [line for line in lines if line.get("runId") == run_id]
    assert ours and all(line["session"] == f"{ns}/{name}" for line in ours), ours
    assert any("settled completed" in line["message"] for line in ours), ours
    assert operator.node is not None
    pod_logs = operator.node.pod_dir(ns, f"corral-{name}") / "logs"
    harness = _json_lines((pod_logs / "harness.log").read_text())
    assert any(
        line.get("runId") == run_id and "settled completed" in line["message"] for line in harness
    ), harness
    custodian = _json_lines((pod_logs / "custodian.log").read_text())
    assert any(
        line.get("runId") == run_id and "model requests of run" in line["message"]
        for line in custodian
    ), custodian

    # ---- a restarted operator: no Event twice, no spending counted again.
    _restart(operator)
    again = waited(
        operator,
        "the restarted operator's view of the Session",
        metrics_url,
        lambda s: (
            value(s, "corral_sessions", namespace=ns, phase="Succeeded") == 1
            and value(s, "corral_approvals_pending", namespace=ns) == _pending(operator)
        ),
    )
    assert value(again, "corral_cost_usd_total", namespace=ns) == 0
    assert value(again, "corral_tokens_total", namespace=ns) == 0
    wait_for(
        "the restarted operator's first passes",
        lambda: value(scrape(metrics_url), "corral_reconcile_duration_seconds_count") > 0,
    )
    time.sleep(3)  # Events are posted from a queue: give a repeated one time to show
    assert Counter(reasons()) == told


def test_the_chart_renders_metrics_a_service_monitor_and_the_dashboard_on_request() -> None:
    helm = controlplane.binaries() / "helm"
    chart = controlplane.REPO_ROOT / "charts" / "corral"

    def render(*values: str) -> list[dict[str, Any]]:
        args = [str(helm), "template", "corral", str(chart), "--namespace", "corral-system"]
        args += ["--kube-version", "1.34.4", "--set-json", 'watchNamespaces=["agents"]']
        for item in values:
            args += ["--set-json", item]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return [d for d in yaml.safe_load_all(done.stdout) if d]

    def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in docs}

    def operator(docs: list[dict[str, Any]]) -> dict[str, Any]:
        """The operator's Deployment (the egress gateway has its own)."""
        (deployment,) = [
            d
            for d in docs
            if d["kind"] == "Deployment" and d["metadata"]["name"] == "corral-operator"
        ]
        return deployment

    docs = render()
    deployment = operator(docs)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--log-format=json" in container["args"]
    assert "--metrics-addr=0.0.0.0:9090" in container["args"]
    assert {"name": "metrics", "containerPort": 9090} in container["ports"]
    assert ("Service", "corral-operator-metrics") in kinds(docs)
    assert ("ServiceMonitor", "corral-operator") not in kinds(docs)  # off by default
    assert ("ConfigMap", "corral-grafana-dashboard") not in kinds(docs)

    docs = render(
        'metrics.serviceMonitor={"enabled": true, "labels": {"release": "prom"}}',
        "metrics.grafanaDashboard.enabled=true",
        'operator.logFormat="text"',
    )
    # The operator's; the egress gateway's own is tests/node/test_chart_gateway.py's.
    (monitor,) = [
        d
        for d in docs
        if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "corral-operator"
    ]
    (service,) = [d for d in docs if d["metadata"]["name"] == "corral-operator-metrics"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    (dashboard,) = [d for d in docs if d["metadata"]["name"] == "corral-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["corral.json"])["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for series in (
        "corral_sessions",
        "corral_turn_settlements_total",
        "corral_cost_usd_total",
        "corral_tokens_total",
        "corral_approvals_pending",
        "corral_reconcile_duration_seconds_bucket",
        "corral_admission_duration_seconds_bucket",
        "corral_session_first_turn_seconds_bucket",
        "corral_sandbox_pods_started_total",
    ):
        assert series in exprs, series
    deployment = operator(docs)
    assert "--log-format=text" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    off = render("metrics.enabled=false")
    args = operator(off)["spec"]["template"]["spec"]
    assert not any(a.startswith("--metrics-addr") for a in args["containers"][0]["args"])
    assert ("Service", "corral-operator-metrics") not in kinds(off)

    bad = subprocess.run(
        [str(helm), "template", "corral", str(chart), "--kube-version", "1.34.4",
         "--set-json", 'watchNamespaces=["agents"]', "--set-json", 'operator.logFormat="xml"'],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "/operator/logFormat" in bad.stderr, bad.stderr
