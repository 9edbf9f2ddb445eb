"""The custodian's trace collector setting (docs/tracing.md): OpenTelemetry's rule, and a URL
that is not one stops the start."""

from __future__ import annotations

import pytest

from corral_custodian.settings import SettingsError, from_env

BASE = {
    "CORRAL_CUSTODIAN_INSECURE": "1",
    "CORRAL_AGENT_SPEC_JSON": '{"identity": "You write code.", "model": "claude-test"}',
}


def test_the_base_gets_v1_traces_and_the_traces_endpoint_is_taken_as_is() -> None:
    assert from_env(BASE).otlp_traces_url is None
    based = from_env(BASE | {"CORRAL_OTLP_ENDPOINT": "http://collector:4318/"})
    assert based.otlp_traces_url == "http://collector:4318/v1/traces"
    named = BASE | {
        "CORRAL_OTLP_ENDPOINT": "http://collector:4318",
        "CORRAL_OTLP_TRACES_ENDPOINT": "https://traces.example/otlp/traces",
    }
    assert from_env(named).otlp_traces_url == "https://traces.example/otlp/traces"


@pytest.mark.parametrize("url", ["collector:4318", "grpc://collector:4317", "http://"])
def test_a_collector_that_is_not_an_http_url_stops_the_start(url: str) -> None:
    with pytest.raises(SettingsError, match="CORRAL_OTLP_ENDPOINT must be an http"):
        from_env(BASE | {"CORRAL_OTLP_ENDPOINT": url})
