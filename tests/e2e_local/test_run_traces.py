"""`corral run` with an OTLP collector in its environment (docs/tracing.md): the run's spans
reach it through the custodian's relay, as in a pod, and behind the run's local gateway as the
custodian's. Real processes: the CLI, the harness, the custodian, the scripted model, the
gateway and a collector on an address of its own (127.0.0.7, not in the harness's NO_PROXY)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ..wire._collector import PROTOBUF, running_collector
from ..wire._gateway import gateway_binary
from .conftest import corral_argv, run_env, write_session

pytestmark = pytest.mark.timeout(120)

COLLECTOR_IP = "127.0.0.7"


def test_the_runs_spans_reach_the_collector_through_the_custodian_and_the_gateway(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[
            {"tool_use": {"name": "bash", "input": {"command": "echo traced"}}},
            {"text": "Done."},
        ],
    )
    docs = session.read_text().split("\n---\n")
    agent = json.loads(docs[0])
    # An egress rule, so the run goes through its local gateway.
    agent["spec"]["sandbox"] = {"egress": [{"host": "pypi.org"}]}
    session.write_text(json.dumps(agent) + "\n---\n" + docs[1])
    state = tmp_path / "state"
    with running_collector(COLLECTOR_IP) as collector:
        env = {
            **run_env(),
            "CORRAL_GATEWAY_BINARY": str(gateway_binary()),
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        }
        done = subprocess.run(
            [*corral_argv(), "run", "-f", str(session), "--workspace", str(demo_workspace),
             "--scenario", str(scenario), "--state-dir", str(state)],
            capture_output=True, text=True, env=env, timeout=100, cwd=tmp_path, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        (run,) = collector.wait("invoke_agent")
        assert collector.wait("execute_tool bash")
    assert run["attributes"]["run.status"] == "completed"
    # Sent by the custodian (its httpx client), never by the harness's own exporter.
    assert all(e.headers["user-agent"].startswith("python-httpx/") for e in collector.exports)
    assert all(e.headers["content-type"] == PROTOBUF for e in collector.exports)
    log = (state / "logs" / "gateway.log").read_text()
    decisions = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    to_collector = {
        (d["identity"], d["decision"]) for d in decisions if d.get("host") == COLLECTOR_IP
    }
    assert to_collector == {("custodian", "allowed")}, decisions
