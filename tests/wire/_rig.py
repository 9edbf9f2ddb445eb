"""The conformance rig: the real `corral-harness` process, the scripted model and a Menu stand-in.

The harness runs as a subprocess on a free loopback port with its own state dir and granted
root, and talks to the scripted model through its default engine adapter (lean, over httpx;
tests/wire/test_engine.py runs the SDK adapter too). The Menu stand-in is a
small real HTTP server that plays the custodian's surface (it is a stand-in: the real custodian
is `corral_custodian`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral_dev.ports import free_port
from corral_dev.scripted import ScriptedModel, parse_script

# Short waits so the suite stays fast; the defaults are 10 s, 120 s and 300 s.
FAST_ENV = {
    "CORRAL_PICK_SWEEP_SECONDS": "1.5",
    "CORRAL_STREAM_IDLE_SECONDS": "1.5",
    "CORRAL_STREAM_CAP_SECONDS": "3",
    "CORRAL_RETRY_BACKOFF_SECONDS": "0.05",
    "CORRAL_BASH_TIMEOUT_SECONDS": "20",
}

AGENT = {
    "identity": "You are a test agent.",
    "instructions": "Be brief.",
    "model": "corral-scripted",
    # Menu tools pass the same default-deny allowlist as working tools.
    "tools": {"allow": ["read", "write", "edit", "bash", "grep", "glob", "mcp__corral__*"]},
}


def new_conversation() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


class MenuStandIn:
    """Stand-in for the custodian's Menu: a surface per conversation, answers per tool name."""

    def __init__(self) -> None:
        self.surfaces: dict[str, list[dict[str, Any]]] = {}
        self.answers: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.surface_reads: list[str] = []
        # Approvals as the custodian keeps them: name -> decision (Pending/Approved/Denied).
        self.decisions: dict[str, str] = {}
        self.app = Starlette(
            routes=[
                Route("/agents/{conv}/surface", self._surface, methods=["GET"]),
                Route("/agents/{conv}/tools/{name}", self._tool, methods=["POST"]),
                Route("/approvals/{name}", self._approval, methods=["GET"]),
            ]
        )

    async def _surface(self, request: Request) -> Response:
        conv = request.path_params["conv"]
        self.surface_reads.append(conv)
        return JSONResponse({"tools": self.surfaces.get(conv, [])})

    async def _approval(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.decisions:
            return JSONResponse({"error": "unknown_approval"}, status_code=404)
        return JSONResponse({"approval": name, "decision": self.decisions[name]})

    async def _tool(self, request: Request) -> Response:
        conv, name = request.path_params["conv"], request.path_params["name"]
        self.calls.append((conv, name, await request.json()))
        if name == "request_approval":
            approval = f"apr-{len(self.decisions) + 1}"
            self.decisions[approval] = "Pending"
            content = json.dumps({"approval": approval, "decision": "Pending"})
            return JSONResponse({"content": content, "isError": False, "endsTurn": True})
        answer = self.answers.get((conv, name), {"content": f"{name} done"})
        return JSONResponse({"isError": False, "endsTurn": False, **answer})


def serve(app: Any) -> tuple[str, uvicorn.Server]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "stand-in server did not start"
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server


@dataclass
class Harness:
    """One `corral-harness` process and a client for its wire."""

    model_url: str
    menu_url: str | None
    state_dir: Path
    root: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start the process; returns seconds until /readyz answered 200."""
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "ANTHROPIC_"))}
        env.update(FAST_ENV)
        env.update(
            CORRAL_HARNESS_ADDR=f"127.0.0.1:{self.port}",
            CORRAL_STATE_DIR=str(self.state_dir),
            CORRAL_GRANTED_ROOT=str(self.root),
            ANTHROPIC_BASE_URL=self.model_url,
        )
        if self.menu_url:
            env["CORRAL_CUSTODIAN_URL"] = self.menu_url
        env.update(self.extra_env)
        self.log_path = self.state_dir.parent / f"harness-{self.port}.log"
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "corral-harness")],
                env=env,
                stdout=log,
                stderr=log,
            )
        while True:
            assert self.proc.poll() is None, f"harness exited: {self.log_path.read_text()}"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            # Generous: on a busy 2-core machine a start can take ten times its usual second.
            assert time.monotonic() - started < 90, "harness did not become ready in 90 s"
            time.sleep(0.02)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    # ----------------------------------------------------------------------------- the wire

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, headers=self.headers(), timeout=30, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers=self.headers(), timeout=70, **kw)

    def admit(
        self, conv: str, message: str = "go", agent: str = "agent", **body: Any
    ) -> dict[str, Any]:
        payload = {"message": message, "agent": body.pop("spec", AGENT), **body}
        response = self.post(f"/agents/{agent}/{conv}", payload)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def abort(self, conv: str, body: Any = None, agent: str = "agent", **kw: Any) -> bool:
        if body is None and not kw:
            response = httpx.post(f"{self.url}/agents/{agent}/{conv}/abort", headers=self.headers())
        else:
            response = self.post(f"/agents/{agent}/{conv}/abort", body, **kw)
        assert response.status_code == 200, response.text
        return bool(response.json()["aborted"])

    def history(self, conv: str, agent: str = "agent") -> list[dict[str, Any]]:
        response = self.get(f"/agents/{agent}/{conv}/history")
        assert response.status_code == 200, response.text
        return list(response.json()["events"])

    def wait_settled(
        self,
        conv: str,
        submission_id: str,
        offset: int = 0,
        timeout: float = 20,
        agent: str = "agent",
    ) -> dict[str, Any]:
        """Long-poll the updates view until the submission's settlement arrives."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.get(
                f"/agents/{agent}/{conv}/updates", params={"offset": offset, "wait": 5}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            for event in body["events"]:
                if event["type"] == "settled" and event["submissionId"] == submission_id:
                    return dict(event)
            offset = body["offset"]
        raise AssertionError(f"{submission_id} did not settle in {timeout} s")

    def wait_for(self, conv: str, kind: str, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.history(conv):
                if event["type"] == kind:
                    return event
            time.sleep(0.02)
        raise AssertionError(f"no {kind} event in {timeout} s")


class Model:
    """The scripted model as the tests drive it: set replies per conversation, read requests."""

    def __init__(self, scripted: ScriptedModel, url: str) -> None:
        self.scripted = scripted
        self.url = url

    def script(self, conv: str, replies: list[Any]) -> None:
        self.scripted.set_script(parse_script({"conversations": {conv: replies}}))

    def requests(self, conv: str) -> list[dict[str, Any]]:
        return [r["body"] for r in self.scripted.requests if r["conversation"] == conv]

    def wait_requests(self, conv: str, count: int, timeout: float = 10) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.requests(conv)) < count:
            assert time.monotonic() < deadline, f"the model got {len(self.requests(conv))} requests"
            time.sleep(0.01)
        return self.requests(conv)
