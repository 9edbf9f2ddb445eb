"""Traces leave a sandbox through its custodian (docs/tracing.md): the harness exports to the
custodian's relay, only the custodian is given the collector, and so only the custodian's
gateway rules name it; the same with a gateway or without."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from corral_operator import naming
from corral_operator.builders.podbuilder import build_sandbox
from corral_operator.main import parse_args, settings_from
from corral_operator.settings import EgressGateway
from tests._objects import agent, session

from .test_podbuilder import CREDENTIAL, SETTINGS, TOKEN

COLLECTOR = "http://198.18.7.7:4318"
RELAY = "$(CORRAL_CUSTODIAN_URL)/otlp/v1/traces"
GATEWAY = EgressGateway(
    address="198.19.0.40", port=3128, namespace="corral-system", pod_labels={"app": "gateway"}
)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _pod(**settings: Any) -> dict[str, Any]:
    built = build_sandbox(
        agent(),
        session(),
        replace(SETTINGS, **settings),
        TOKEN,
        CREDENTIAL,
        egress_credential="e" * 43,
    )
    return built.pod


@pytest.mark.parametrize("gateway", [None, GATEWAY], ids=["no-gateway", "gateway"])
def test_the_harness_exports_to_its_custodian_which_alone_has_the_collector(
    gateway: EgressGateway | None,
) -> None:
    settings = settings_from(parse_args(["-A", "--otlp-endpoint", COLLECTOR]))
    assert settings.otlp_endpoint == COLLECTOR
    pod = _pod(otlp_endpoint=COLLECTOR, egress_gateway=gateway)
    containers = {
        c["name"]: c for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    }
    harness_list = [e["name"] for e in containers["harness"]["env"]]
    harness = _env(containers["harness"])
    assert harness["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == RELAY
    assert harness["OTEL_SERVICE_NAME"] == "corral-harness"
    # A dependent variable: the kubelet expands $(CORRAL_CUSTODIAN_URL) only when it comes
    # first, and the harness sends its credential only to its custodian's own origin.
    assert harness_list.index("CORRAL_CUSTODIAN_URL") < harness_list.index(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    assert harness["CORRAL_CUSTODIAN_URL"].startswith("http://$(")
    assert _env(containers["custodian"])["CORRAL_OTLP_ENDPOINT"] == COLLECTOR
    # The collector's address is in the custodian alone: no container but it is told.
    for name, container in containers.items():
        if name != "custodian":
            assert COLLECTOR not in json.dumps(container.get("env", [])), name
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in _env(container), name


def test_behind_the_gateway_the_collector_is_a_rule_of_the_custodian_alone() -> None:
    pod = _pod(otlp_endpoint=COLLECTOR, egress_gateway=GATEWAY)
    bound = json.loads(pod["metadata"]["annotations"][naming.ANNOTATION_EGRESS_BINDING])
    rule = {"host": "198.18.7.7", "ports": [4318], "private": True}
    assert rule in bound["custodianRules"]
    assert all(r.get("host") != "198.18.7.7" for r in bound["agentRules"])


def test_without_an_endpoint_no_exporter_is_configured() -> None:
    assert settings_from(parse_args(["-A"])).otlp_endpoint is None
    pod = build_sandbox(agent(), session(), SETTINGS, TOKEN, CREDENTIAL).pod
    for container in pod["spec"]["containers"]:
        env = _env(container)
        assert not {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} & set(env)
        assert "CORRAL_OTLP_ENDPOINT" not in env
