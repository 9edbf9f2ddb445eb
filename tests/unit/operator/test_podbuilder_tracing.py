"""The OTLP endpoint reaches the sandbox's harness alone (docs/tracing.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from corral_operator.builders.podbuilder import build_sandbox
from corral_operator.main import parse_args, settings_from
from tests._objects import agent, session

from .test_podbuilder import CREDENTIAL, SETTINGS, TOKEN

COLLECTOR = "http://198.18.7.7:4318"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_the_flag_sets_the_harness_exporter_and_nothing_else() -> None:
    settings = settings_from(parse_args(["-A", "--otlp-endpoint", COLLECTOR]))
    assert settings.otlp_endpoint == COLLECTOR
    pod = build_sandbox(
        agent(), session(), replace(SETTINGS, otlp_endpoint=COLLECTOR), TOKEN, CREDENTIAL
    ).pod
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    harness = _env(containers.pop("harness"))
    assert harness["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR
    assert harness["OTEL_SERVICE_NAME"] == "corral-harness"
    for name, container in containers.items():
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in _env(container), name


def test_without_an_endpoint_no_exporter_is_configured() -> None:
    assert settings_from(parse_args(["-A"])).otlp_endpoint is None
    pod = build_sandbox(agent(), session(), SETTINGS, TOKEN, CREDENTIAL).pod
    harness = next(c for c in pod["spec"]["containers"] if c["name"] == "harness")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in _env(harness)
