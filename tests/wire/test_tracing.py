"""Traces through the wire, as in a sandbox pod: the real harness process exports its spans to
the real custodian's relay (the pod-local credential as bearer), and the custodian posts them
on to an OTLP/HTTP collector this test runs, whose address only the custodian was given
(docs/tracing.md). The custodian is the harness's Menu and model proxy too; the scripted model
is its upstream."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral_harness.telemetry import trace_id_of
from tests.unit.custodian._custodian_proc import Custodian, running_custodian

from ._collector import PROTOBUF, Collector, running_collector
from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(90)

CREDENTIAL = "pod-local-credential-for-traces-0123"


@dataclass
class Relay:
    collector: Collector
    custodian: Custodian
    credential_file: Path


@pytest.fixture
def relay(tmp_path: Path, model: Model) -> Iterator[Relay]:
    credential = tmp_path / "pod-credential"
    credential.write_text(CREDENTIAL + "\n")
    with running_collector() as collector:
        env = {
            "CORRAL_UPSTREAM_URL": model.url,
            "ANTHROPIC_API_KEY": "sk-ant-only-in-the-custodian-0042",
            "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
            "CORRAL_STATE_DIR": str(tmp_path / "custodian-state"),
            "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
            "CORRAL_OTLP_ENDPOINT": collector.url,
        }
        with running_custodian(env, tmp_path / "custodian.log") as custodian:
            yield Relay(collector, custodian, credential)


def behind(harness: Harness, relay: Relay, **env: str) -> Harness:
    """`harness` as the operator sets it up: the custodian is its model, Menu and relay, and
    nothing names the collector."""
    harness.model_url = harness.menu_url = relay.custodian.url
    harness.extra_env.update(
        CORRAL_CUSTODIAN_CREDENTIAL_FILE=str(relay.credential_file),
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{relay.custodian.url}/otlp/v1/traces",
        OTEL_BSP_SCHEDULE_DELAY="50",
        **env,
    )
    return harness


def test_spans_of_the_turn_each_model_call_and_each_tool_reach_the_collector_through_the_relay(
    fresh_harness: Harness, model: Model, conv: str, relay: Relay
) -> None:
    receiver = relay.collector
    behind(fresh_harness, relay, OTEL_SERVICE_NAME="harness").start()
    model.script(
        conv,
        [
            {
                "tool_use": {"name": "bash", "input": {"command": "echo hi"}},
                "usage": {"input_tokens": 40, "output_tokens": 7},
            },
            {"text": "done", "usage": {"input_tokens": 60, "output_tokens": 3}},
        ],
    )
    run_id = "session-uid-1.3"
    admitted = fresh_harness.admit(conv, "trace me", runId=run_id)
    assert fresh_harness.wait_settled(conv, admitted["submissionId"])["status"] == "completed"

    (run,) = receiver.wait("invoke_agent")
    chats = receiver.wait("chat corral-scripted")
    (tool,) = receiver.wait("execute_tool bash")
    # One trace, derived from the run id the operator minted, for every span of the run.
    assert {s["trace_id"] for s in [run, *chats, tool]} == {trace_id_of(run_id)}
    assert all(s["parent"] == run["span_id"] for s in [*chats, tool])
    assert run["attributes"]["run.id"] == run_id
    assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert run["attributes"]["gen_ai.conversation.id"] == conv
    assert run["attributes"]["run.status"] == "completed" and run["attributes"]["run.steps"] == 1
    assert len(chats) == 2
    usage = sorted(
        (
            c["attributes"]["gen_ai.usage.input_tokens"],
            c["attributes"]["gen_ai.usage.output_tokens"],
        )
        for c in chats
    )
    assert usage[0][1] in (3, 7) and {u[1] for u in usage} == {3, 7}
    assert all(c["attributes"]["gen_ai.request.model"] == "corral-scripted" for c in chats)
    assert all(c["attributes"]["gen_ai.operation.name"] == "chat" for c in chats)
    assert tool["attributes"]["gen_ai.tool.name"] == "bash"
    assert tool["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert tool["attributes"]["gen_ai.tool.call.id"]
    # The custodian posted them (its httpx, not the harness's exporter), as protobuf, and the
    # pod-local credential the harness presented stopped at the custodian.
    assert receiver.exports and all(e.path == "/v1/traces" for e in receiver.exports)
    for export in receiver.exports:
        assert export.headers["content-type"] == PROTOBUF
        assert export.headers["user-agent"].startswith("python-httpx/"), export.headers
        assert "authorization" not in export.headers
        assert CREDENTIAL not in json.dumps(export.headers)
    assert "traces reach the collector" in relay.custodian.log.read_text()


def test_a_failed_run_marks_its_span_with_the_error_type(
    fresh_harness: Harness, model: Model, conv: str, relay: Relay
) -> None:
    receiver = relay.collector
    behind(fresh_harness, relay).start()
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "echo 1"}}}, "no"])
    spec = {**AGENT, "limits": {"maxStepsPerTurn": 1}}
    model.script(
        conv,
        [{"tool_uses": [{"name": "bash", "input": {"command": f"echo {i}"}} for i in range(2)]}],
    )
    admitted = fresh_harness.admit(conv, "loop", spec=spec, runId="run-2")
    assert fresh_harness.wait_settled(conv, admitted["submissionId"])["error"]["type"] == "runaway"
    (run,) = receiver.wait("invoke_agent")
    assert run["attributes"]["error.type"] == "runaway"


def test_without_an_endpoint_the_harness_imports_no_opentelemetry() -> None:
    # The start path stays lean: the server module, a turn's module and the engine load
    # neither the OpenTelemetry SDK nor its exporter unless tracing is configured. (FastAPI
    # itself imports the small `opentelemetry` API package; that is not ours to avoid.)
    code = (
        "HEAVY = ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.proto');"
        "import sys; import corral_harness.main, corral_harness.server, corral_harness.turn;"
        "from corral_harness.telemetry import TRACING;"
        "assert TRACING.run('r', 'c', 'm').__class__.__name__ == 'RunTrace';"
        "print(sorted(m for m in sys.modules if m.startswith(HEAVY)))"
    )
    env = {"PATH": str(Path(sys.executable).parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
