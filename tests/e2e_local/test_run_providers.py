"""`corral run --providers FILE` through each provider's stand-in (docs/providers.md): the
Agent's `spec.provider` picks the entry, the custodian alone gets the credential from this
shell's variables, and the session succeeds with the model reached through Amazon Bedrock
(SigV4 checked with botocore), Google Vertex AI (the JWT grant checked with google-auth) and a
Messages-compatible gateway. The agent's shell finds none of the credentials in its
environment, and none is written into the run's record.

The three runs go side by side; the stand-ins are served from this test process, the scripted
model (a real process) behind them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_cli import _processes as proc
from corral_dev.providers._bedrock import BedrockStandIn
from corral_dev.providers._bedrock import serve_in_thread as serve_bedrock
from corral_dev.providers._gateway import GatewayStandIn, serve_gateway_in_thread
from corral_dev.providers._vertex import VertexStandIn, make_service_account, serve_vertex_in_thread

from .conftest import read_lines, run_argv, run_env, write_session

pytestmark = pytest.mark.timeout(120)

GATEWAY_KEY = "gw-key-for-corral-run-0123456789"
LOOK = (
    "printenv | grep -E '^(AWS_ACCESS_KEY_ID|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|"
    "GOOGLE_APPLICATION_CREDENTIALS|ANTHROPIC_API_KEY)=' || echo no-credential-in-my-env"
)
SCRIPT = {
    "default": [
        {"tool_use": {"name": "bash", "input": {"command": LOOK}}},
        {"text": "Done.", "usage": {"input_tokens": 321, "output_tokens": 9}},
    ]
}


@pytest.fixture
async def upstream(tmp_path: Path) -> AsyncIterator[str]:
    script = tmp_path / "upstream.json"
    script.write_text(json.dumps(SCRIPT))
    parts = proc.Parts(tmp_path / "upstream-logs")
    port = proc.free_port()
    model = parts.start("upstream", proc.scripted_argv(port, script), proc.base_env(), port)
    try:
        await parts.wait_ready(model, "/_requests")
        yield model.url
    finally:
        parts.stop()


@pytest.fixture
def standins(upstream: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        bedrock = BedrockStandIn(upstream=upstream, region="eu-west-1")
        running_b = serve_bedrock(bedrock)
        stack.callback(running_b.stop)
        account = make_service_account()
        vertex = VertexStandIn(upstream, account=account)
        running_v = serve_vertex_in_thread(vertex)
        stack.callback(running_v.stop)
        gateway = GatewayStandIn(upstream, key=GATEWAY_KEY)
        running_g = serve_gateway_in_thread(gateway)
        stack.callback(running_g.stop)
        key_file = tmp_path / "service-account.json"
        key_file.write_text(json.dumps(account.key))
        providers = [
            {"name": "bedrock-eu", "type": "bedrock", "region": "eu-west-1",
             "endpointUrl": running_b.url},
            {"name": "vertex", "type": "vertex", "project": vertex.project,
             "region": vertex.region, "endpointUrl": running_v.url, "tokenUrl": vertex.token_url},
            {"name": "llm-gw", "type": "gateway", "baseUrl": running_g.url,
             "authHeader": "authorization", "authScheme": "Bearer"},
        ]  # fmt: skip
        providers_file = tmp_path / "providers.yaml"
        providers_file.write_text(json.dumps({"modelProviders": providers}))
        yield {
            "file": providers_file,
            "bedrock-eu": (bedrock, {"AWS_ACCESS_KEY_ID": bedrock.access_key_id,
                                     "AWS_SECRET_ACCESS_KEY": bedrock.secret_access_key}),
            "vertex": (vertex, {"GOOGLE_APPLICATION_CREDENTIALS": str(key_file)}),
            "llm-gw": (gateway, {"ANTHROPIC_API_KEY": GATEWAY_KEY}),
        }  # fmt: skip


def _session_for(directory: Path, provider: str) -> Path:
    directory.mkdir()
    session, _ = write_session(directory, scenario_replies=[], evaluation=None, name=provider)
    docs = [json.loads(line) for line in session.read_text().split("\n---\n")]
    docs[0]["spec"]["provider"] = provider
    session.write_text("\n---\n".join(json.dumps(d) for d in docs) + "\n")
    return session


def _secrets_of(env: dict[str, str]) -> list[str]:
    values = [v for k, v in env.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"]
    if "GOOGLE_APPLICATION_CREDENTIALS" in env:
        key = json.loads(Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).read_text())
        values.append(key["private_key"].splitlines()[1])
    return values


async def test_corral_run_reaches_the_model_through_each_provider(
    standins: dict[str, Any], upstream: str, demo_workspace: Path, tmp_path: Path
) -> None:
    runs: dict[str, tuple[subprocess.Popen[str], Path]] = {}
    for provider in ("bedrock-eu", "vertex", "llm-gw"):
        session = _session_for(tmp_path / provider, provider)
        state_dir = tmp_path / f"state-{provider}"
        env = run_env() | standins[provider][1]
        argv = [*run_argv(session, demo_workspace, state_dir, "--providers",
                          str(standins["file"]), "--allow-dirty"), "--json"]  # fmt: skip
        runs[provider] = (
            subprocess.Popen(
                argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            ),
            state_dir,
        )
    for provider, (process, state_dir) in runs.items():
        out, err = process.communicate(timeout=90)
        assert process.returncode == 0, f"{provider}: {err}{out}"
        outcome = json.loads(out.strip().splitlines()[-1])
        assert outcome["outcome"] == "Succeeded", outcome
        env = standins[provider][1]
        ran = [e for e in read_lines(state_dir / "transcript.jsonl") if e["type"] == "tool_end"]
        assert ran and "no-credential-in-my-env" in ran[0]["result"], ran
        for path in (state_dir / "transcript.jsonl", state_dir / "state.json"):
            text = path.read_text()
            for secret in _secrets_of(env):
                assert secret not in text, (provider, path)
        state = json.loads((state_dir / "state.json").read_text())
        assert state["usage"]["inputTokens"] >= 321, state["usage"]  # the provider's usage
    # Each provider's stand-in carried its own run's two requests, and nothing else.
    bedrock, _ = standins["bedrock-eu"]
    assert [f["model_id"] for f in bedrock.forwarded] == [
        "eu.anthropic.claude-sonnet-4-5-20250929-v1:0"
    ] * 2
    vertex, _ = standins["vertex"]
    assert [r["model"] for r in vertex.requests if r["kind"] == "predict"] == [
        "claude-sonnet-4-5@20250929"
    ] * 2
    async with httpx.AsyncClient() as http:
        requests = (await http.get(f"{upstream}/_requests")).json()
    assert len(requests) == 6
    assert os.environ.get("AWS_SECRET_ACCESS_KEY") is None  # the test's own shell is unchanged
