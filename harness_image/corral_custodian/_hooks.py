"""http hooks of `Agent.spec.hooks`, POSTed by the custodian on the harness's behalf.

    POST /agents/{conversation}/hooks/{phase}/{name}     the hook's event (JSON object)

The harness names a hook; everything else comes from the Agent as the custodian reads it
itself (cluster or local spec): the URL, the headers, the timeout. Secret header values come
from the Agent's `credentials.hookSecretRef`, mounted into this container alone
(`CORRAL_HOOK_SECRET_DIR`, one file per key), so the harness never holds them. Egress goes
only to the URL the Agent names: no redirect is followed, so the host is fixed. The answer is
relayed as is when it is empty or a JSON object; anything else is a `502` with a reason, a
timeout a `504`, so the harness applies the hook's `onError`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from corral_api.hook_spec import HOOK_PHASES, AgentHooks, HookSpec

from ._live import LiveError, LiveState
from ._proxy import BodyTooLarge, read_capped
from ._secrets import SecretTooShort
from .settings import CustodianSettings, SettingsError, register_hook_secret

log = logging.getLogger("corral_custodian.hooks")

MAX_ANSWER_BYTES = 1024 * 1024


class HookProblem(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.error, "reason": self.reason}, status_code=self.status)


def find_hook(hooks: AgentHooks, phase: str, name: str) -> HookSpec:
    if phase not in HOOK_PHASES:
        raise HookProblem(404, "unknown_hook", f"{phase!r} is not a hook phase")
    for hook in hooks.for_phase(phase):
        if hook.name == name:
            if hook.http is None:
                raise HookProblem(
                    400, "bad_input", f"hook {name!r} is a command hook; the harness runs it"
                )
            return hook
    raise HookProblem(404, "unknown_hook", f"the Agent has no {phase} hook named {name!r}")


def hook_headers(hook: HookSpec, secret_dir: Path | None) -> dict[str, str]:
    """The headers the Agent names for this hook, secrets read from the mounted Secret."""
    assert hook.http is not None
    headers = {"content-type": "application/json"}
    for header in hook.http.headers:
        if header.value is not None:
            headers[header.name] = header.value
            continue
        assert header.secret_key is not None
        if secret_dir is None:
            raise HookProblem(
                503,
                "hook_secret_unavailable",
                f"hook {hook.name!r} needs secret key {header.secret_key!r}, but the Agent has "
                "no credentials.hookSecretRef mounted here",
            )
        try:
            secret = (secret_dir / header.secret_key).read_text().strip()
        except OSError:
            raise HookProblem(
                503,
                "hook_secret_unavailable",
                f"key {header.secret_key!r} of credentials.hookSecretRef is not there",
            ) from None
        try:  # read afresh, so a rotated value is registered with the redactor before use
            register_hook_secret(header.secret_key, secret)
        except (SecretTooShort, SettingsError) as e:
            raise HookProblem(503, "hook_secret_unavailable", str(e)) from None
        headers[header.name] = header.prefix + secret
    return headers


async def post_hook(hook: HookSpec, timeout: float, body: bytes, headers: dict[str, str]) -> str:
    """POST to the hook's own URL (no redirects); the answer text, or a HookProblem."""
    assert hook.http is not None
    try:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            response = await client.post(hook.http.url, content=body, headers=headers)
    except httpx.TimeoutException:
        raise HookProblem(504, "hook_timeout", f"timed out after {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise HookProblem(502, "hook_failed", f"the hook's endpoint: {exc!r}") from None
    if not 200 <= response.status_code < 300:
        raise HookProblem(
            502, "hook_failed", f"the hook's endpoint answered {response.status_code}"
        )
    text = response.content[:MAX_ANSWER_BYTES].decode(errors="replace")
    if text.strip():
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise HookProblem(502, "hook_failed", "the hook's answer is not a JSON object")
    return text


def add_hook_routes(app: FastAPI, live: LiveState, settings: CustodianSettings) -> None:
    @app.post("/agents/{conversation}/hooks/{phase}/{name}")
    async def run_hook(conversation: str, phase: str, name: str, request: Request) -> Response:
        try:
            raw = await read_capped(request, settings.max_body_bytes)
        except BodyTooLarge:
            return HookProblem(413, "too_large", "the hook event is too large").response()
        try:
            event = json.loads(raw)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            return HookProblem(400, "bad_input", "the hook event must be a JSON object").response()
        try:
            facts = (await live.load()).facts
        except LiveError as e:
            return HookProblem(503, "agent_spec_unreadable", str(e)).response()
        try:
            hook = find_hook(facts.agent.hooks, phase, name)
            timeout = float(hook.timeout_seconds or facts.agent.hooks.timeout_seconds)
            headers = hook_headers(hook, settings.hook_secret_dir)
            # What the custodian knows for sure goes in over what the harness says.
            event.update(hook=name, phase=phase, session=facts.name, namespace=facts.namespace)
            answer = await post_hook(hook, timeout, json.dumps(event).encode(), headers)
        except HookProblem as problem:
            log.warning("hook %s/%s for %s: %s", phase, name, conversation, problem.reason)
            return problem.response()
        return Response(answer, media_type="application/json")
