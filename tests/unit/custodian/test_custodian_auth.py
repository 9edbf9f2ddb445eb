"""Who may call the custodian: only the holder of the pod-local credential on the harness
port (every path but /readyz), only the wire token on the operator port; everyone else gets a
401 with a reason, and the custodian logs who tried what."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_api.wire import CustodianUsage
from corral_dev.ports import free_port

from ._custodian_proc import CUSTODIAN, running_custodian

pytestmark = pytest.mark.timeout(60)

AGENT = json.dumps(
    {"identity": "x", "model": "claude-haiku-4-5", "tools": {"allow": ["mcp__corral__*"]}}
)
MESSAGE = {
    "model": "claude-haiku-4-5",
    "max_tokens": 5,
    "messages": [{"role": "user", "content": "x"}],
}

ENDPOINTS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/messages", MESSAGE),
    ("GET", "/agents/c1/surface", None),
    ("POST", "/agents/c1/tools/push", {}),
    ("POST", "/agents/c1/tools/request_approval", {"tool": "bash"}),
    ("POST", "/agents/c1/tools/spawn_child", {"task": "t"}),
    ("GET", "/approvals/some-approval", None),
    ("GET", "/usage", None),
    ("GET", "/v1/usage", None),
    ("GET", "/anything/else", None),
]


def _reason(response: httpx.Response) -> str:
    body = response.json()
    if "error" in body and isinstance(body["error"], dict):
        return str(body["error"]["message"])  # Anthropic's shape, on /v1/messages
    return str(body["reason"])


@pytest.mark.parametrize(
    ("label", "headers", "fragment"),
    [
        ("none", {}, "no credential was presented"),
        ("wrong bearer", {"authorization": "Bearer not-the-credential"}, "is not the pod-local"),
        ("wrong api key", {"x-api-key": "not-the-credential"}, "is not the pod-local"),
        ("not bearer", {"authorization": "Basic Zm9vOmJhcg=="}, "no credential was presented"),
    ],
)
def test_every_endpoint_but_readyz_refuses_a_caller_without_the_credential(
    tmp_path: Path, label: str, headers: dict[str, str], fragment: str
) -> None:
    env = {"CORRAL_AGENT_SPEC_JSON": AGENT, "CORRAL_STATE_DIR": str(tmp_path / "state")}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        with httpx.Client(base_url=custodian.url, timeout=10) as client:
            for method, path, body in ENDPOINTS:
                response = client.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (label, path, response.text)
                assert fragment in _reason(response), (label, path)
                assert response.headers["x-should-retry"] == "false"
            assert client.get("/readyz").status_code == 200
        # The custodian names the caller's address and the path it tried.
        log = custodian.log.read_text()
        for _, path, _ in ENDPOINTS:
            assert f"{path} from 127.0.0.1:" in log, path
        # The model proxy's refusal reads like Anthropic's, so the SDK reports it.
        refused = httpx.post(custodian.url + "/v1/messages", json=MESSAGE, headers=headers)
        assert refused.json()["error"]["type"] == "authentication_error"


def test_the_credential_opens_every_endpoint_as_bearer_and_as_api_key(tmp_path: Path) -> None:
    env = {"CORRAL_AGENT_SPEC_JSON": AGENT, "CORRAL_UPSTREAM_URL": "http://127.0.0.1:9"}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        bearer = {"authorization": f"Bearer {custodian.credential}"}
        api_key = {"x-api-key": custodian.credential}
        for headers in (bearer, api_key):
            surface = httpx.get(custodian.url + "/agents/c1/surface", headers=headers)
            assert surface.status_code == 200 and surface.json() == {"tools": []}
            # Through to the (dead) upstream: the credential was accepted.
            model = httpx.post(custodian.url + "/v1/messages", json=MESSAGE, headers=headers)
            assert model.status_code == 502, model.text
        # The operator's wire token is not the harness's credential, nor the other way round.
        assert custodian.wire_token is not None
        wire = {"authorization": f"Bearer {custodian.wire_token}"}
        assert httpx.get(custodian.url + "/agents/c1/surface", headers=wire).status_code == 401


def test_the_operator_port_serves_usage_only_to_the_wire_token(tmp_path: Path) -> None:
    env = {
        "CORRAL_AGENT_SPEC_JSON": json.dumps(
            {
                "identity": "x",
                "model": "claude-haiku-4-5",
                "limits": {"budget": {"tokens": 5000, "costUSD": 2.5}},
            }
        ),
        "CORRAL_BUDGET_TOKENS": "9000",
        "CORRAL_BUDGET_COST": "1.5",
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        assert custodian.operator_url is not None
        url = custodian.operator_url + "/v1/usage"
        for headers, fragment in (
            ({}, "no credential was presented"),
            ({"authorization": "Bearer nope"}, "is not the session's wire token"),
            # The harness's credential does not open the operator port.
            (custodian.headers, "is not the session's wire token"),
            # Nor is the wire token accepted as an API key there.
            ({"x-api-key": str(custodian.wire_token)}, "no credential was presented"),
        ):
            refused = httpx.get(url, headers=headers)
            assert refused.status_code == 401, headers
            assert fragment in refused.json()["reason"]
        answer = CustodianUsage.model_validate(custodian.usage())
        # The cap is the lowest of the Session's (env) and the Agent's, per axis.
        assert (answer.budget.tokens, answer.budget.costUSD) == (5000, 1.5)
        assert answer.usage.input == 0 and answer.exceeded is False
        assert "refused GET /v1/usage from 127.0.0.1:" in custodian.log.read_text()
        # The operator port serves nothing else.
        wire = {"authorization": f"Bearer {custodian.wire_token}"}
        other = httpx.get(custodian.operator_url + "/agents/c1/surface", headers=wire)
        assert other.status_code == 404


def _start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ.get("PATH", ""), "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{free_port()}"}
    return subprocess.run(
        [str(CUSTODIAN)], env=full | env, capture_output=True, text=True, timeout=20
    )


def test_without_a_credential_file_it_refuses_to_start_unless_told_it_is_insecure(
    tmp_path: Path,
) -> None:
    refused = _start({"CORRAL_AGENT_SPEC_JSON": AGENT})
    assert refused.returncode == 2
    assert "CORRAL_CUSTODIAN_CREDENTIAL_FILE is not set" in refused.stderr
    assert "CORRAL_CUSTODIAN_INSECURE=1" in refused.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    refused = _start(
        {"CORRAL_AGENT_SPEC_JSON": AGENT, "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(empty)}
    )
    assert refused.returncode == 2 and "is empty" in refused.stderr
    no_token = _start(
        {
            "CORRAL_AGENT_SPEC_JSON": AGENT,
            "CORRAL_CUSTODIAN_INSECURE": "1",
            "CORRAL_CUSTODIAN_OPERATOR_ADDR": f"127.0.0.1:{free_port()}",
        }
    )
    assert no_token.returncode == 2 and "CORRAL_WIRE_TOKEN_FILE is not" in no_token.stderr

    insecure = {"CORRAL_AGENT_SPEC_JSON": AGENT, "CORRAL_CUSTODIAN_INSECURE": "1"}
    with running_custodian(insecure, tmp_path / "insecure.log", operator=False) as custodian:
        assert httpx.get(custodian.url + "/agents/c1/surface").status_code == 200
        assert "every caller is served" in custodian.log.read_text()
