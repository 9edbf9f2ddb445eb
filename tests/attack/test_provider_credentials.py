"""A malicious agent whose Agent reaches Claude through Amazon Bedrock (keys, and the cluster's
web identity) and Google Vertex AI (docs/providers.md) goes after the cloud credentials from
its shell: the mounted Secrets, the projected web identity token, every process's environment.
It finds none, and the canary sweep then finds none of them, nor any credential the providers
minted from them (STS session keys, Google access tokens: read from the stand-ins' books), in
anything a party without a credential can read.
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
from corral_dev.providers._vertex import VertexStandIn, make_service_account, serve_vertex_in_thread

from ..cluster._operator_fixtures import (
    OperatorExtras,
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
)
from ._canary import Canary, Places, Sweep, report

pytestmark = pytest.mark.timeout(240)

ROLE = "arn:aws:iam::123456789012:role/corral-bedrock"
# The agent's shell, looking everywhere a provider's credential could be.
GRAB = (
    "cat /var/run/corral/aws/* /var/run/corral/gcp/* /var/run/corral/aws-web-identity/* "
    "2>&1 | head -c 2000; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; "
    "done | grep -E '^(AWS_|GOOGLE_|CORRAL_AWS|CORRAL_GCP|CORRAL_MODEL_PROVIDER)' | sort -u; "
    "ls -la /var/run/corral 2>&1; echo grabbed"
)


@pytest.fixture
def standins(scripted_model: ScriptedModelHandle) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        bedrock = BedrockStandIn(upstream=scripted_model.url, region="us-east-2", role_arns=(ROLE,))
        running_b = serve_bedrock(bedrock)
        stack.callback(running_b.stop)
        account = make_service_account()
        vertex = VertexStandIn(scripted_model.url, account=account)
        running_v = serve_vertex_in_thread(vertex)
        stack.callback(running_v.stop)
        yield {"bedrock": bedrock, "bedrock_url": running_b.url, "vertex": vertex,
               "vertex_url": running_v.url, "account": account}  # fmt: skip


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


@pytest.fixture
def operator_extras(
    operator_extras: OperatorExtras, standins: dict[str, Any], tmp_path: Path
) -> OperatorExtras:
    """The suite's operator (console, archive, canary credentials) with the providers added."""
    bedrock, vertex = standins["bedrock"], standins["vertex"]
    providers = [
        {"name": "bedrock-keys", "type": "bedrock", "region": "us-east-2",
         "endpointUrl": standins["bedrock_url"]},
        {"name": "bedrock-wi", "type": "bedrock", "region": "us-east-2", "webIdentity": True,
         "roleArn": ROLE, "endpointUrl": standins["bedrock_url"],
         "stsUrl": standins["bedrock_url"]},
        {"name": "vertex", "type": "vertex", "project": vertex.project, "region": vertex.region,
         "endpointUrl": standins["vertex_url"], "tokenUrl": vertex.token_url},
        {"name": "anthropic", "type": "anthropic", "default": True},
    ]  # fmt: skip
    path = tmp_path / "providers.json"
    path.write_text(json.dumps(providers))
    inner = operator_extras.args
    return OperatorExtras(
        args=lambda: [*inner(), f"--model-providers-file={path}"],
        secrets=[
            *operator_extras.secrets,
            _secret(
                "aws-keys",
                {
                    "aws_access_key_id": bedrock.access_key_id,
                    "aws_secret_access_key": bedrock.secret_access_key,
                },
            ),
            _secret("vertex-key", {"key.json": json.dumps(standins["account"].key)}),
        ],
        credentials=operator_extras.credentials,
        hooks=operator_extras.hooks,
        started=operator_extras.started,
    )


AGENTS = {
    "bedrock-keys": {"awsSecretRef": {"name": "aws-keys"}},
    "bedrock-wi": {},
    "vertex": {"gcpSecretRef": {"name": "vertex-key", "key": "key.json"}},
}


def _canaries(standins: dict[str, Any]) -> list[Canary]:
    bedrock: BedrockStandIn = standins["bedrock"]
    vertex: VertexStandIn = standins["vertex"]
    found = [Canary.plain("aws-secret-key", bedrock.secret_access_key)]
    for key in bedrock.issued():
        found.append(Canary.plain("aws-minted-secret", key.secret_access_key))
        if key.session_token:
            found.append(Canary.plain("aws-minted-session-token", key.session_token))
    found += [Canary.plain("gcp-access-token", token) for token in vertex.issued]
    pem_lines = standins["account"].key["private_key"].splitlines()
    found += [Canary.plain("gcp-private-key", line) for line in pem_lines[1:4]]
    return found


def test_the_agent_finds_no_provider_credential_and_none_leaves_the_custodian(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    standins: dict[str, Any],
    canary_places: Places,
    git_repo: Path,
) -> None:
    sessions = {provider: f"grab-{provider}" for provider in AGENTS}
    grab = {"tool_use": {"name": "bash", "input": {"command": GRAB}}}
    scripted_model.load(
        {"conversations": {name: [grab, {"text": "Nothing to see."}] for name in sessions.values()}}
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
        [request] = [r for r in scripted_model.requests(name) if _answers_the_grab(r)]
        result = json.dumps(request["body"]["messages"][-1])
        assert "grabbed" in result  # the shell ran
        assert "AWS_" not in result and "CORRAL_MODEL_PROVIDER" not in result, result
    canaries = _canaries(standins)
    assert {c.name for c in canaries} >= {"aws-minted-secret", "gcp-access-token"}
    sweep = Sweep(canaries, canary_places)
    try:
        findings = sweep.run()
        assert sweep.read["kube objects"] > 0 and sweep.read["node roots"] > 0, sweep.read
    finally:
        sweep.close()
    if findings:
        pytest.fail(report(findings, title="provider credentials found"), pytrace=False)


def _answers_the_grab(request: dict[str, Any]) -> bool:
    messages = request["body"].get("messages") or []
    return bool(messages) and "tool_result" in json.dumps(messages[-1])
