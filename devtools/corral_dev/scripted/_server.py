"""The scripted model's HTTP side: an Anthropic-compatible `/v1/messages` and the test hooks."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..ports import free_port
from ._cache import PrefixBlock, PromptCache, TooManyBreakpoints, prefix_blocks
from ._script import Fault, Reply, Script, ScriptError, check_holds, parse_script

_TEXT_CHUNK = 24  # characters per text_delta, so a cut can land inside a text block
EXHAUSTED = "(the scripted model has no more replies for this conversation)"


class ScriptedModel:
    """Replays a script per conversation and records every request it gets."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.requests: list[dict[str, Any]] = []
        self._cursor: dict[str, int] = {}
        self._lock = threading.Lock()
        # What requests to this server wrote to the prompt cache (usage as the provider bills).
        self.cache = PromptCache()
        self.app = Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/_requests", self._requests, methods=["GET", "DELETE"]),
                Route("/_script", self._set_script, methods=["POST"]),
                Route("/_cache", self._clear_cache, methods=["DELETE"]),
                Route("/readyz", self._ready, methods=["GET"]),
            ]
        )

    # ------------------------------------------------------------------------- script handling

    def set_script(self, script: Script, *, merge: bool = True) -> None:
        with self._lock:
            if merge:
                if script.default:
                    self.script.default = script.default
                self.script.conversations.update(script.conversations)
                for conv in script.conversations:
                    self._cursor.pop(conv, None)
            else:
                self.script = script
                self._cursor.clear()

    def _next_reply(self, conversation: str) -> Reply | None:
        with self._lock:
            replies = self.script.replies_for(conversation)
            index = self._cursor.get(conversation, 0)
            self._cursor[conversation] = index + 1
            return replies[index] if index < len(replies) else None

    # ------------------------------------------------------------------------------- endpoints

    async def _ready(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def _requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
            return JSONResponse({"cleared": True})
        conv = request.query_params.get("conversation")
        found = [r for r in self.requests if conv is None or r["conversation"] == conv]
        return JSONResponse(found)

    async def _clear_cache(self, request: Request) -> Response:
        self.cache.clear()  # as after five idle minutes: every prefix is written afresh
        return JSONResponse({"cleared": True})

    async def _set_script(self, request: Request) -> Response:
        try:
            script = parse_script(await request.json())
        except (ScriptError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        self.set_script(script, merge=request.query_params.get("replace") != "1")
        return JSONResponse({"ok": True})

    async def _messages(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_request_error", "the body is not JSON")
        if not isinstance(body, dict) or "messages" not in body or "model" not in body:
            return _error(400, "invalid_request_error", "model and messages are required")
        conversation = str((body.get("metadata") or {}).get("user_id") or "")
        self.requests.append(
            {
                "conversation": conversation,
                "ts": time.time(),
                "body": body,
                "headers": {
                    k: v
                    for k, v in request.headers.items()
                    if k
                    in (
                        "x-api-key",
                        "authorization",
                        "anthropic-version",
                        "user-agent",
                        "x-corral-run-id",
                    )
                },
            }
        )
        record = self.requests[-1]  # its usage is added once the reply is made
        problem = _orphans(body["messages"])
        if problem:
            return _error(400, "invalid_request_error", problem)
        try:
            blocks = prefix_blocks(body)
        except TooManyBreakpoints as exc:
            return _error(400, "invalid_request_error", str(exc))
        reply = self._next_reply(conversation)
        if reply is None:
            reply = Reply(content=[{"type": "text", "text": EXHAUSTED}])
        if reply.when:
            failed = check_holds(reply.when, body)
            if failed is not None:
                if reply.otherwise is None:
                    return _error(400, "invalid_request_error", f"script check failed: {failed}")
                reply = reply.otherwise
        if reply.delay:
            await asyncio.sleep(reply.delay)
        fault = reply.fault
        if fault and fault.status is not None:
            return _error(fault.status, fault.error_type, fault.message)
        message = _materialise(reply, body, self.cache, blocks)
        record["usage"] = message["usage"]  # as billed: tests and benches read it here
        if not body.get("stream"):
            return JSONResponse(message)
        return StreamingResponse(_stream(message, reply, fault), media_type="text/event-stream")


def _error(status: int, kind: str, message: str) -> Response:
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
    )


def _orphans(messages: list[dict[str, Any]]) -> str | None:
    """The provider's rule: each tool_use is answered by a tool_result in the next message."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        asked = {b.get("id") for b in content if b.get("type") == "tool_use"}
        if not asked:
            continue
        following = messages[i + 1]["content"] if i + 1 < len(messages) else []
        answered = {
            b.get("tool_use_id")
            for b in (following if isinstance(following, list) else [])
            if b.get("type") == "tool_result"
        }
        missing = asked - answered
        if missing:
            return f"tool_use ids without a tool_result in the next message: {sorted(missing)}"
    return None


def _estimate_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value)) // 4)


# The usage fields of the prompt's side: a script that names one of them names them all.
_INPUT_SIDE = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _usage(
    reply: Reply, content: list[dict[str, Any]], cache: PromptCache, blocks: list[PrefixBlock]
) -> dict[str, int]:
    """The estimate (the prompt cache's split of the input), then what the script says."""
    usage = {**cache.usage(blocks), "output_tokens": _estimate_tokens(content)}
    if any(key in reply.usage for key in _INPUT_SIDE):
        usage.update(dict.fromkeys(_INPUT_SIDE, 0))
    usage.update(reply.usage)
    return usage


def _materialise(
    reply: Reply, body: dict[str, Any], cache: PromptCache, blocks: list[PrefixBlock]
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for block in reply.content:
        block = dict(block)
        if block["type"] == "tool_use" and not block.get("id"):
            block["id"] = f"toolu_{uuid.uuid4().hex[:24]}"
        if block["type"] == "thinking":
            block.setdefault("signature", "scripted-signature")
        content.append(block)
    usage = _usage(reply, content, cache, blocks)
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": reply.final_stop_reason(),
        "stop_sequence": None,
        "usage": usage,
    }


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    kind = block["type"]
    start: dict[str, Any]
    deltas: list[dict[str, Any]]
    if kind == "text":
        start = {"type": "text", "text": ""}
        text = block["text"]
        deltas = [
            {"type": "text_delta", "text": text[i : i + _TEXT_CHUNK]}
            for i in range(0, len(text), _TEXT_CHUNK)
        ]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        raw = json.dumps(block["input"])
        half = len(raw) // 2
        deltas = [
            {"type": "input_json_delta", "partial_json": raw[:half]},
            {"type": "input_json_delta", "partial_json": raw[half:]},
        ]
    events = [
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
    ]
    events += [
        _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


async def _stream(
    message: dict[str, Any], reply: Reply, fault: Fault | None
) -> AsyncIterator[bytes]:
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield _sse("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(message["content"]):
        if fault and fault.after_blocks == index:
            async for chunk in _fault_events(fault):
                yield chunk
            if fault.error_event or fault.truncate:
                return
        for event in _block_events(index, block):
            if reply.event_delay:
                await asyncio.sleep(reply.event_delay)
            yield event
    if fault and fault.after_blocks >= len(message["content"]):
        async for chunk in _fault_events(fault):
            yield chunk
        if fault.error_event or fault.truncate:
            return
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


async def _fault_events(fault: Fault) -> AsyncIterator[bytes]:
    if fault.silence:
        await asyncio.sleep(fault.silence)
    if fault.error_event:
        yield _sse(
            "error",
            {"type": "error", "error": {"type": fault.error_type, "message": fault.message}},
        )


# ------------------------------------------------------------------------------ running it


@dataclass
class RunningServer:
    url: str
    model: ScriptedModel
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


def serve_in_thread(model: ScriptedModel, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Serve `model` on a background thread (for tests and benchmarks in one process)."""
    port = port or free_port(host)
    config = uvicorn.Config(model.app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="scripted-model", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted model server did not start")
        time.sleep(0.01)
    return RunningServer(f"http://{host}:{port}", model, server, thread)
