"""The custodian's trace relay (docs/tracing.md) as real processes: behind the real
corral-gateway the harness's spans reach the collector as the custodian's (its proxy
credential); and the relay's answers on its own: no pod-local credential 401, an oversize export
413, a collector that is down 502 with a reason, the collector's own answer passed back, the
bytes relayed as they came.

The gateway binds 127.0.0.1 (where the custodian connects from) to a Session whose custodian
may reach collector.test, a name its hosts file gives 127.0.0.7 (under --allow-range, this
tier's stand-in for the internet)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral_dev.ports import free_port
from corral_harness.telemetry import trace_id_of
from tests.unit.custodian._custodian_proc import Custodian, running_custodian

from ._collector import PROTOBUF, Collector, one_span_export, running_collector
from ._gateway import binding, start_gateway, write_bindings
from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(90)

COLLECTOR_IP = "127.0.0.7"
PROXY_CREDENTIAL = "session-proxy-credential-for-traces"
RELAY = "/otlp/v1/traces"


def custodian_env(tmp_path: Path, model: Model, collector: str) -> dict[str, str]:
    return {
        "CORRAL_UPSTREAM_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-only-in-the-custodian-0042",
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        "CORRAL_STATE_DIR": str(tmp_path / "custodian-state"),
        "CORRAL_OTLP_ENDPOINT": collector,
    }


def post(custodian: Custodian, body: bytes, **headers: str) -> httpx.Response:
    sent = {"content-type": PROTOBUF, **custodian.headers, **headers}
    return httpx.post(custodian.url + RELAY, content=body, headers=sent, timeout=30)


def test_the_harness_spans_reach_the_collector_through_the_gateway_as_the_custodians(
    tmp_path: Path, model: Model, conv: str
) -> None:
    with running_collector(COLLECTOR_IP) as collector:
        port = int(collector.url.rsplit(":", 1)[1])
        hosts = tmp_path / "hosts"
        hosts.write_text(f"{COLLECTOR_IP} collector.test\n")
        bindings = tmp_path / "bindings.json"
        rules = [{"host": "collector.test", "ports": [port], "private": False}]
        session = binding(
            namespace="team", session="s1", agent="coder", credential=PROXY_CREDENTIAL,
            custodian_rules=rules,
        )  # fmt: skip
        write_bindings(bindings, [("127.0.0.1", "uid-1", session)])
        gateway = start_gateway(
            tmp_path / "gw",
            ["--bindings-file", str(bindings), "--hosts-file", str(hosts),
             "--allow-range", f"{COLLECTOR_IP}/32"],
        )  # fmt: skip
        proxy_credential = tmp_path / "egress-credential"
        proxy_credential.write_text(PROXY_CREDENTIAL + "\n")
        credential = tmp_path / "pod-credential"
        credential.write_text("pod-local-credential-for-traces-0123\n")
        env = custodian_env(tmp_path, model, f"http://collector.test:{port}") | {
            "CORRAL_EGRESS_PROXY": gateway.proxy_url,
            "CORRAL_EGRESS_CREDENTIAL_FILE": str(proxy_credential),
            "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
        }
        try:
            with running_custodian(env, tmp_path / "custodian.log") as custodian:
                (tmp_path / "state").mkdir()
                (tmp_path / "root").mkdir()
                harness = Harness(
                    custodian.url, custodian.url, tmp_path / "state", tmp_path / "root",
                    extra_env={
                        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
                        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": custodian.url + RELAY,
                        "OTEL_BSP_SCHEDULE_DELAY": "50",
                    },
                )  # fmt: skip
                harness.start()
                try:
                    model.script(conv, ["traced"])
                    admitted = harness.admit(conv, "go", runId="run-gw-1")
                    settled = harness.wait_settled(conv, admitted["submissionId"])
                    assert settled["status"] == "completed", settled
                    (run,) = collector.wait("invoke_agent")
                finally:
                    harness.stop()
        finally:
            gateway.stop()
    assert run["trace_id"] == trace_id_of("run-gw-1")
    # The gateway let it through as the custodian's, and the credential went no further.
    decided = [d for d in gateway.decisions() if d.get("host") == "collector.test"]
    assert decided and {(d["identity"], d["decision"]) for d in decided} == {
        ("custodian", "allowed")
    }, decided
    for export in collector.exports:
        assert "proxy-authorization" not in export.headers
        assert "authorization" not in export.headers


@pytest.fixture
def relay(tmp_path: Path, model: Model) -> Iterator[tuple[Custodian, Collector]]:
    with (
        running_collector() as collector,
        running_custodian(
            custodian_env(tmp_path, model, collector.url), tmp_path / "custodian.log"
        ) as custodian,
    ):
        yield custodian, collector


def test_an_export_without_the_pod_local_credential_is_refused(
    relay: tuple[Custodian, Collector],
) -> None:
    custodian, collector = relay
    for headers in ({}, {"authorization": "Bearer not-the-credential"}):
        refused = httpx.post(
            custodian.url + RELAY, content=one_span_export(), headers=headers, timeout=10
        )
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"] == "unauthorized" and refused.json()["reason"]
    assert collector.exports == []


def test_the_bytes_go_on_as_they_came_and_the_collectors_answer_comes_back(
    relay: tuple[Custodian, Collector],
) -> None:
    custodian, collector = relay
    body = gzip.compress(one_span_export("zipped"))
    relayed = post(custodian, body, **{"content-encoding": "gzip", "x-extra": "harness-only"})
    assert relayed.status_code == 200, relayed.text
    (export,) = collector.exports
    assert export.body == body and export.path == "/v1/traces"
    assert export.headers["content-encoding"] == "gzip"
    assert export.headers["content-type"] == PROTOBUF
    assert "x-extra" not in export.headers and "authorization" not in export.headers
    assert [s["name"] for s in collector.spans] == ["zipped"]

    # JSON too: the content type says what the bytes are, the relay does not read them.
    as_json = b'{"resourceSpans": []}'
    assert post(custodian, as_json, **{"content-type": "application/json"}).status_code == 200
    assert collector.exports[-1].body == as_json
    assert collector.exports[-1].headers["content-type"] == "application/json"

    # A collector that is busy says so, and when to try again; the exporter reads it.
    collector.status, collector.answer_headers = 503, {"retry-after": "7"}
    busy = post(custodian, one_span_export())
    assert busy.status_code == 503 and busy.headers["retry-after"] == "7"


def test_an_oversize_export_is_refused_with_the_limit(
    relay: tuple[Custodian, Collector],
) -> None:
    custodian, collector = relay
    too_big = post(custodian, b"\0" * (4 * 1024 * 1024 + 1))
    assert too_big.status_code == 413
    assert too_big.json()["error"] == "too_large" and "4194304 bytes" in too_big.json()["reason"]
    assert collector.exports == []


def test_a_collector_that_is_down_is_a_502_with_the_reason(tmp_path: Path, model: Model) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    log = tmp_path / "custodian.log"
    with running_custodian(custodian_env(tmp_path, model, down), log) as custodian:
        for _ in range(3):
            answer = post(custodian, one_span_export())
            assert answer.status_code == 502, answer.text
            assert answer.json()["error"] == "collector_unreachable"
            assert "unreachable" in answer.json()["reason"]
    # Said once, then counted: an exporter retries every few seconds.
    warnings = [line for line in log.read_text().splitlines() if "not reaching" in line]
    assert len(warnings) == 1 and "1 failed" in warnings[0], warnings


def test_without_a_collector_the_relay_says_so(tmp_path: Path, model: Model) -> None:
    env = custodian_env(tmp_path, model, "")
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        answer = post(custodian, one_span_export())
    assert answer.status_code == 404 and answer.json()["error"] == "no_collector"
