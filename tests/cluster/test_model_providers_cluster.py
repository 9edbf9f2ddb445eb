"""One Session per non-Anthropic provider on the real API server, operator and local node
(docs/providers.md), run side by side: Amazon Bedrock with the Agent's keys, Amazon Bedrock
with the cluster's web identity (the local node projects a real TokenRequest token with
audience sts.amazonaws.com into the custodian, which the STS stand-in exchanges), Google
Vertex AI with a service-account key, and a Messages-compatible gateway. Each stand-in checks
what the real endpoint checks (SigV4 with botocore, the JWT grant with google-auth) and answers
from the scripted model; each Session Succeeds, with the provider's usage in its status.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from corral_dev.providers._bedrock import BedrockStandIn
from corral_dev.providers._bedrock import serve_in_thread as serve_bedrock
from corral_dev.providers._gateway import GatewayStandIn, serve_gateway_in_thread
from corral_dev.providers._vertex import VertexStandIn, make_service_account, serve_vertex_in_thread

from ._operator_fixtures import (
    OperatorExtras,
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
)

pytestmark = pytest.mark.timeout(240)

ROLE = "arn:aws:iam::123456789012:role/corral-bedrock"
GATEWAY_KEY = "gw-key-for-the-cluster-0123456789"
USAGE = {"input_tokens": 1234, "output_tokens": 56}


@pytest.fixture
def standins(scripted_model: ScriptedModelHandle) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        bedrock = BedrockStandIn(upstream=scripted_model.url, region="us-west-2", role_arns=(ROLE,))
        running_b = serve_bedrock(bedrock)
        stack.callback(running_b.stop)
        account = make_service_account()
        vertex = VertexStandIn(scripted_model.url, account=account)
        running_v = serve_vertex_in_thread(vertex)
        stack.callback(running_v.stop)
        gateway = GatewayStandIn(scripted_model.url, key=GATEWAY_KEY)
        running_g = serve_gateway_in_thread(gateway)
        stack.callback(running_g.stop)
        yield {
            "bedrock": bedrock, "bedrock_url": running_b.url, "vertex": vertex,
            "vertex_url": running_v.url, "account": account, "gateway": gateway,
            "gateway_url": running_g.url,
        }


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


@pytest.fixture
def operator_extras(standins: dict[str, Any], tmp_path: Path) -> OperatorExtras:
    """The operator with the platform's providers (each at its stand-in), and the Secrets the
    Agents name."""
    bedrock, vertex = standins["bedrock"], standins["vertex"]
    providers = [
        {"name": "bedrock-keys", "type": "bedrock", "region": "us-west-2",
         "endpointUrl": standins["bedrock_url"]},
        {"name": "bedrock-wi", "type": "bedrock", "region": "us-west-2", "webIdentity": True,
         "roleArn": ROLE, "endpointUrl": standins["bedrock_url"],
         "stsUrl": standins["bedrock_url"]},
        {"name": "vertex", "type": "vertex", "project": vertex.project, "region": vertex.region,
         "endpointUrl": standins["vertex_url"], "tokenUrl": vertex.token_url},
        {"name": "llm-gw", "type": "gateway", "baseUrl": standins["gateway_url"],
         "authHeader": "authorization", "authScheme": "Bearer"},
    ]  # fmt: skip
    path = tmp_path / "providers.json"
    path.write_text(json.dumps(providers))
    return OperatorExtras(
        args=lambda: [f"--model-providers-file={path}"],
        secrets=[
            _secret(
                "aws-keys",
                {
                    "aws_access_key_id": bedrock.access_key_id,
                    "aws_secret_access_key": bedrock.secret_access_key,
                },
            ),
            _secret("vertex-key", {"key.json": json.dumps(standins["account"].key)}),
            _secret("gateway-key", {"token": GATEWAY_KEY}),
        ],
    )


AGENTS = {
    "bedrock-keys": {"awsSecretRef": {"name": "aws-keys"}},
    "bedrock-wi": {},
    "vertex": {"gcpSecretRef": {"name": "vertex-key", "key": "key.json"}},
    "llm-gw": {"modelSecretRef": {"name": "gateway-key", "key": "token"}},
}


def test_a_session_succeeds_through_each_provider_side_by_side(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    standins: dict[str, Any],
    git_repo: Path,
) -> None:
    sessions = {provider: f"via-{provider}" for provider in AGENTS}
    scripted_model.load(
        {
            "conversations": {
                name: [{"text": f"Done via {name}.", "usage": USAGE}] for name in sessions.values()
            }
        }
    )
    docs: list[dict[str, Any]] = []
    for provider, credentials in AGENTS.items():
        agent = f"agent-{provider}"
        docs.append(agent_doc(agent, provider=provider, credentials=credentials))
        docs.append(session_doc(sessions[provider], git_repo, agent=agent))
    operator.apply(*docs)
    for provider, name in sessions.items():
        status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=150)
        assert status["phase"] == "Succeeded", (provider, status)
        usage = status["usage"]
        assert usage["inputTokens"] == USAGE["input_tokens"], (provider, usage)
        assert usage["outputTokens"] == USAGE["output_tokens"], (provider, usage)
    bedrock: BedrockStandIn = standins["bedrock"]
    models = {f["model_id"] for f in bedrock.forwarded}
    assert models == {"us.anthropic.corral-scripted-v1:0"}
    assert len(bedrock.forwarded) == 2  # one Session with keys, one with the web identity
    [exchange] = [c for c in bedrock.sts_calls if c.get("action") == "AssumeRoleWithWebIdentity"]
    assert exchange.get("role_arn") == ROLE, exchange
    vertex: VertexStandIn = standins["vertex"]
    assert [r["model"] for r in vertex.requests if r["kind"] == "predict"] == ["corral-scripted@1"]
    gateway: GatewayStandIn = standins["gateway"]
    assert [r["auth"] for r in gateway.requests] == [f"Bearer {GATEWAY_KEY}"]
