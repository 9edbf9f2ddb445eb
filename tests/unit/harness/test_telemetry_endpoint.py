"""Where the harness's spans go and what they carry (docs/tracing.md): OpenTelemetry's rule for
the endpoint, and the custodian credential on the custodian's own relay alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral_harness.telemetry import custodian_headers, traces_endpoint

CUSTODIAN = "http://10.1.2.3:8081"


def test_the_traces_url_is_used_as_is_and_the_base_gets_the_signal_path() -> None:
    relay = f"{CUSTODIAN}/otlp/v1/traces"
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": relay} | base) == relay
    assert traces_endpoint(base) == "http://collector:4318/v1/traces"
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}) is None
    assert traces_endpoint({}) is None


def test_the_credential_goes_to_the_custodians_origin_and_nowhere_else(tmp_path: Path) -> None:
    credential = tmp_path / "credential"
    credential.write_text("pod-local-credential-77\n")
    relay = f"{CUSTODIAN}/otlp/v1/traces"
    assert custodian_headers(relay, CUSTODIAN, credential) == {
        "authorization": "Bearer pod-local-credential-77"
    }
    # Same origin however it is spelled: default port, case.
    assert custodian_headers("HTTP://LOCALHOST/otlp/v1/traces", "http://localhost:80", credential)
    for elsewhere in (
        "http://collector:4318/v1/traces",
        "http://10.1.2.3:4318/v1/traces",  # the pod's address, another port
        "https://10.1.2.3:8081/otlp/v1/traces",  # another scheme
    ):
        assert custodian_headers(elsewhere, CUSTODIAN, credential) == {}, elsewhere
    assert custodian_headers(relay, None, credential) == {}  # a harness on its own
    assert custodian_headers(relay, CUSTODIAN, None) == {}  # an insecure local custodian


def test_an_empty_credential_file_is_an_error_not_an_empty_token(tmp_path: Path) -> None:
    empty = tmp_path / "credential"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        custodian_headers(f"{CUSTODIAN}/otlp/v1/traces", CUSTODIAN, empty)
