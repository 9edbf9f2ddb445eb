"""Agent.spec.hooks that do not run in the harness: `runIn: tools` through a real corral-exec,
and an `http` hook POSTed by the real custodian to a loopback server this test starts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..unit.custodian._custodian_proc import Custodian, running_custodian
from ..unit.tools_exec._service import ExecService
from ._rig import Harness, Model, serve
from .test_agent_spec_hooks import agent_with, system_text, tool_results

pytestmark = pytest.mark.timeout(90)

HARNESS_SIDE_ROOT = Path("/corral-not-mounted/workspace")
HOOK_TOKEN = "hook-token-only-the-custodian-holds-1f9a"


# ------------------------------------------------------------------------ runIn: tools


@pytest.fixture
def exec_harness(tmp_path: Path, model: Model) -> Iterator[tuple[Harness, Path]]:
    tools_root = (tmp_path / "tools-root").resolve()
    tools_root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "ANTHROPIC_"))}
    service = ExecService(tools_root, tmp_path / "shared" / "exec.sock", env)
    (tmp_path / "state").mkdir()
    harness = Harness(
        model.url,
        None,
        tmp_path / "state",
        HARNESS_SIDE_ROOT,
        extra_env={"CORRAL_EXEC_SOCKET": str(service.socket)},
    )
    harness.start()
    yield harness, tools_root
    harness.stop()
    service.stop()


def test_a_run_in_tools_linter_sees_the_workspace_through_the_exec_service(
    exec_harness: tuple[Harness, Path], model: Model, conv: str
) -> None:
    harness, tools_root = exec_harness
    assert not HARNESS_SIDE_ROOT.exists()  # the harness cannot see the files itself
    lint = (
        'path=$(sed -n \'s/.*"path": *"\\([^"]*\\)".*/\\1/p\')\n'
        'if grep -q " $" "$path"; then\n'
        '  printf \'{"additionalContext": "lint(%s): trailing whitespace in %s"}\' \\\n'
        '    "$(pwd)" "$path"\n'
        "fi\n"
    )
    hooks = {
        "afterTool": [{"name": "lint", "matcher": ["write"], "command": lint, "runIn": "tools"}]
    }
    model.script(
        conv,
        [
            {"tool_use": {"name": "write", "input": {"path": "a.py", "content": "x = 1  \n"}}},
            "done",
        ],
    )
    admitted = harness.admit(conv, spec=agent_with(hooks))
    settled = harness.wait_settled(conv, admitted["submissionId"], timeout=60)
    assert settled["status"] == "completed", settled
    assert (tools_root / "a.py").read_text() == "x = 1  \n"
    _, after_write = model.requests(conv)
    assert f"lint({tools_root}): trailing whitespace in a.py" in system_text(after_write)


# ------------------------------------------------------------------------ http via custodian


class HookEndpoint:
    """The platform team's policy server: records what it got, vetoes `rm`."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.app = Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])

    async def _hook(self, request: Request) -> Response:
        event = await request.json()
        self.calls.append((dict(request.headers), event))
        if "rm " in json.dumps(event.get("toolInput", {})):
            return JSONResponse(
                {"decision": "deny", "reason": "the policy server refuses rm", "continue": True}
            )
        return Response(b"", status_code=200)


@pytest.fixture
def endpoint() -> Iterator[tuple[HookEndpoint, str]]:
    hook = HookEndpoint()
    url, server = serve(hook.app)
    yield hook, url
    server.should_exit = True


def _http_agent(url: str) -> dict[str, Any]:
    return agent_with(
        {
            "beforeTool": [
                {
                    "name": "policy",
                    "matcher": ["bash"],
                    "http": {
                        "url": f"{url}/hook",
                        "headers": [
                            {"name": "Authorization", "secretKey": "token", "prefix": "Bearer "},
                            {"name": "X-Team", "value": "platform"},
                        ],
                    },
                }
            ]
        }
    )


@pytest.fixture
def custodian(tmp_path: Path, endpoint: tuple[HookEndpoint, str]) -> Iterator[Custodian]:
    secrets = tmp_path / "hook-secret"
    secrets.mkdir()
    (secrets / "token").write_text(HOOK_TOKEN + "\n")
    env = {
        "CORRAL_AGENT_SPEC_JSON": json.dumps(_http_agent(endpoint[1])),
        "CORRAL_HOOK_SECRET_DIR": str(secrets),
        "CORRAL_STATE_DIR": str(tmp_path / "custodian-state"),
    }
    with running_custodian(env, tmp_path / "custodian.log", operator=False) as running:
        yield running


def test_an_http_hook_goes_through_the_custodian_which_adds_the_credential(
    tmp_path: Path,
    model: Model,
    conv: str,
    endpoint: tuple[HookEndpoint, str],
    custodian: Custodian,
) -> None:
    hook, url = endpoint
    credential_file = tmp_path / "harness-credential"
    credential_file.write_text(custodian.credential)
    (tmp_path / "state").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "keep").write_text("precious")
    harness = Harness(
        model.url,
        custodian.url,
        tmp_path / "state",
        tmp_path / "root",
        extra_env={"CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential_file)},
    )
    harness.start()
    try:
        model.script(
            conv,
            [
                {"tool_use": {"name": "bash", "input": {"command": "rm keep"}}},
                {"tool_use": {"name": "bash", "input": {"command": "echo fine"}}},
                "done",
            ],
        )
        admitted = harness.admit(conv, spec=_http_agent(url))
        settled = harness.wait_settled(conv, admitted["submissionId"], timeout=60)
        assert settled["status"] == "completed", settled
        assert (tmp_path / "root" / "keep").read_text() == "precious"
        denied, ran = tool_results(model.requests(conv)[2])
        assert "the policy server refuses rm" in json.dumps(denied["content"])
        assert "fine" in json.dumps(ran["content"])

        (headers, first), (_, second) = hook.calls
        assert headers["authorization"] == f"Bearer {HOOK_TOKEN}"
        assert headers["x-team"] == "platform"
        assert first["toolInput"] == {"command": "rm keep"}
        assert (first["hook"], first["phase"], first["session"]) == (
            "policy",
            "beforeTool",
            "local",
        )
        assert second["toolInput"] == {"command": "echo fine"}

        # The harness never held the credential: not in its environment, not in its state.
        assert harness.proc is not None
        environ = Path(f"/proc/{harness.proc.pid}/environ").read_bytes()
        assert HOOK_TOKEN.encode() not in environ
        for path in (tmp_path / "state").rglob("*"):
            if path.is_file():
                assert HOOK_TOKEN.encode() not in path.read_bytes(), path
    finally:
        harness.stop()


def test_the_custodian_hook_endpoint_refuses_strangers_and_unknown_hooks(
    custodian: Custodian,
) -> None:
    event = {"conversation": "c1", "toolName": "bash", "toolInput": {}}
    stranger = httpx.post(f"{custodian.url}/agents/c1/hooks/beforeTool/policy", json=event)
    assert stranger.status_code == 401 and stranger.json()["error"] == "unauthorized"
    with custodian.client() as client:
        unknown = client.post("/agents/c1/hooks/beforeTool/other", json=event)
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_hook"
        phase = client.post("/agents/c1/hooks/whenever/policy", json=event)
        assert phase.status_code == 404 and "not a hook phase" in phase.json()["reason"]
        bad = client.post("/agents/c1/hooks/beforeTool/policy", content=b"[1]")
        assert bad.status_code == 400 and bad.json()["error"] == "bad_input"


def test_a_custodian_without_the_hook_secret_refuses_with_a_reason(
    tmp_path: Path, endpoint: tuple[HookEndpoint, str]
) -> None:
    env = {"CORRAL_AGENT_SPEC_JSON": json.dumps(_http_agent(endpoint[1]))}
    with (
        running_custodian(env, tmp_path / "c.log", operator=False) as running,
        running.client() as client,
    ):
        answer = client.post(
            "/agents/c1/hooks/beforeTool/policy", json={"toolInput": {"command": "ls"}}
        )
    assert answer.status_code == 503
    assert answer.json()["error"] == "hook_secret_unavailable"
    assert "credentials.hookSecretRef" in answer.json()["reason"]
    assert endpoint[0].calls == []  # nothing went out without its credential
