"""Long-term memory, owned by the custodian (docs/memory.md, ADR 0070).

The store is a SQLite file (`CORRAL_MEMORY_SQLITE`, `corral run`) or a PostgreSQL database
(`CORRAL_MEMORY_DSN_FILE`, a cluster); the harness never holds its credentials. Behind the
egress gateway the database is reached through a forwarder on a Unix socket of the custodian's
own, which tunnels through the gateway with the Session's proxy credential (_pgforward.py).
The scope is the Agent's `spec.memory.scope` (default: the Agent's name), read by the custodian
itself and prefixed with its own Session's namespace, so nothing a caller sends can reach
another namespace's memory: the requests below carry no scope at all.

Harness-facing endpoints, behind the pod-local credential like every other path:

    POST /memory/recall    {query, limit?}   -> {facts: [...], lines: [...]}
    POST /memory/extract   {text}            -> {added: [...]}   (X-Corral-Submission: its turn)

and four Menu tools (`mcp__corral__memory_add`, `_rewrite`, `_delete`, `_link`), offered when
the Agent has memory on and its `tools.allow` / `tools.deny` let them through, like every Menu
tool (ADR 0005). Each fact records its origin: this Session and the turn that wrote it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from corral_common import toolmatch
from corral_common.memory import (
    MemoryBackend,
    MemoryInputError,
    MemoryStore,
    MemoryUnavailable,
    Origin,
    PostgresBackend,
    SqliteBackend,
)

from ._live import LiveError, LiveState, Loaded
from ._pgforward import DsnError, PgForwarder, custodian_proxy, plan_forwarding
from ._tools import ToolResult
from .facts import SessionFacts
from .menu import MenuTool
from .settings import EGRESS_PROXY_USER, CustodianSettings

log = logging.getLogger("corral_custodian.memory")

MAX_QUERY_CHARS = 8000
MAX_LIMIT = 20
MAX_EXTRACTED = 20
# `Remember: <subject>: <fact>` on a line of its own, optionally as a list item.
REMEMBER_LINE = re.compile(
    r"^\s*(?:[-*]\s+)?remember:\s*(?P<subject>[^:\n]{1,200}?)\s*:\s*(?P<text>\S.*?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)

_STR = {"type": "string", "minLength": 1}
_ID = {"type": "integer", "minimum": 1, "description": "The fact's id, as recall shows it (#id)."}


def _obj(properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


MEMORY_ADD = MenuTool(
    "memory_add",
    "Remember a fact for later sessions of this agent: a subject and one short statement.",
    _obj({"subject": _STR, "text": _STR}, ("subject", "text")),
    needs_cluster=False,
)
MEMORY_REWRITE = MenuTool(
    "memory_rewrite",
    "Replace the text of a remembered fact (by its #id) that is no longer right.",
    _obj({"id": _ID, "text": _STR}, ("id", "text")),
    needs_cluster=False,
)
MEMORY_DELETE = MenuTool(
    "memory_delete",
    "Forget a remembered fact (by its #id).",
    _obj({"id": _ID}, ("id",)),
    needs_cluster=False,
)
MEMORY_LINK = MenuTool(
    "memory_link",
    "Link two subjects, so recalling one also recalls facts about the other.",
    _obj({"a": _STR, "b": _STR}, ("a", "b")),
    needs_cluster=False,
)
MEMORY_TOOLS: dict[str, MenuTool] = {
    t.name: t for t in (MEMORY_ADD, MEMORY_REWRITE, MEMORY_DELETE, MEMORY_LINK)
}


def _problem(status: int, error: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


def extract_facts(text: str) -> list[tuple[str, str]]:
    """The `Remember: <subject>: <fact>` lines of an answer, in order, without repeats."""
    found: list[tuple[str, str]] = []
    for match in REMEMBER_LINE.finditer(text):
        pair = (match.group("subject").strip(), match.group("text").strip())
        if pair[0] and pair not in found:
            found.append(pair)
    return found[:MAX_EXTRACTED]


def _check_input(tool: MenuTool, tool_input: dict[str, Any]) -> str | None:
    """The tool's schema, checked here: the custodian trusts no caller's input."""
    schema = tool.input_schema
    unknown = sorted(set(tool_input) - set(schema["properties"]))
    if unknown:
        named = ", ".join(map(repr, unknown))
        return f"{tool.name} takes no {named} (the scope is not the caller's to pick)"
    for name in schema["required"]:
        if name not in tool_input:
            return f"{tool.name} needs {name!r}"
    for name, value in tool_input.items():
        if schema["properties"][name]["type"] == "integer":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{name!r} must be a positive whole number"
        elif not isinstance(value, str) or not value.strip():
            return f"{name!r} must be non-empty text"
    return None


class MemoryService:
    """The store behind the endpoints and tools: opened on first use, reopened after a fault."""

    def __init__(self, settings: CustodianSettings, live: LiveState) -> None:
        self._settings = settings
        self._live = live
        self._backend: MemoryBackend | None = None
        self._open_lock = asyncio.Lock()
        # Behind the egress gateway, the PostgreSQL store is reached through a forwarder on a
        # Unix socket of the custodian's own (_pgforward.py); started on first use.
        self._forwarder: PgForwarder | None = None
        self._dsn: str | None = None  # the DSN psycopg gets, once decided

    @property
    def configured(self) -> bool:
        return self._settings.memory_sqlite is not None or self._settings.memory_dsn is not None

    @property
    def forwarder(self) -> PgForwarder | None:
        return self._forwarder

    async def _postgres_dsn(self, dsn: str) -> str:
        """`dsn`, or behind the egress gateway the forwarder's socket in its place (the
        forwarder started on the first call)."""
        s = self._settings
        if self._dsn is not None:
            return self._dsn
        if s.egress_proxy is None or s.egress_credential is None:
            self._dsn = dsn
            return dsn
        try:
            plan = plan_forwarding(dsn, self._socket_dir())
        except DsnError as e:
            raise MemoryUnavailable(str(e)) from e
        if plan is None:  # a Unix socket or loopback: not through the gateway
            self._dsn = dsn
            return dsn
        proxy = custodian_proxy(s.egress_proxy, EGRESS_PROXY_USER, s.egress_credential)
        forwarder = PgForwarder(plan, proxy)
        try:
            await forwarder.start()
        except OSError as e:
            raise MemoryUnavailable(
                f"cannot listen on the memory socket {plan.socket_path}: {e}"
            ) from e
        self._forwarder, self._dsn = forwarder, plan.dsn
        return plan.dsn

    def _socket_dir(self) -> Path:
        s = self._settings
        if s.memory_socket_dir is not None:
            return s.memory_socket_dir
        if s.state_dir is not None:
            return s.state_dir / "memory-socket"
        return Path(tempfile.mkdtemp(prefix="corral-memory-"))  # 0700, this process's own

    def _unavailable(self, error: Exception) -> MemoryUnavailable:
        """`error` as MemoryUnavailable, with the forwarder's last failure when psycopg's
        message does not carry it already (its own timeout came first, say)."""
        reason = str(error)
        failure = self._forwarder.last_failure if self._forwarder is not None else None
        if failure and failure not in reason:
            reason = f"{reason} ({failure})"
        return MemoryUnavailable(reason)

    def _open(self, dsn: str | None) -> MemoryBackend:
        s = self._settings
        if dsn is not None:
            return PostgresBackend(dsn)
        if s.memory_sqlite is not None:
            try:
                return SqliteBackend(s.memory_sqlite)
            except (OSError, sqlite3.Error) as e:
                raise MemoryUnavailable(f"cannot open the memory file: {e}") from e
        raise MemoryUnavailable(
            "no memory store is configured (CORRAL_MEMORY_SQLITE or CORRAL_MEMORY_DSN_FILE)"
        )

    async def _backend_now(self) -> MemoryBackend:
        async with self._open_lock:
            if self._backend is None:
                dsn = self._settings.memory_dsn
                if dsn is not None:
                    dsn = await self._postgres_dsn(dsn)
                try:
                    self._backend = await asyncio.to_thread(self._open, dsn)
                except MemoryUnavailable as e:
                    raise self._unavailable(e) from e
            return self._backend

    def scope(self, facts: SessionFacts) -> str | None:
        """`<namespace>/<scope>`; None when the Agent has no memory, or it is off.

        The namespace is the custodian's own (its environment, checked against the cluster),
        never a caller's; a namespace is a DNS label, so no scope can spell another's prefix."""
        memory = facts.agent.memory
        if memory is None or not memory.enabled:
            return None
        name = memory.scope or facts.agent_ref or self._settings.agent_name
        if not name:
            return None
        return f"{facts.namespace}/{name}"

    def origin(self, facts: SessionFacts, submission: str) -> Origin:
        # In a cluster the turn is the Session's (settled turns + this one); without one the
        # custodian knows no turn count, and the submission id names the turn instead.
        turn = str(facts.turns_used + 1) if facts.cluster else (submission or "?")
        return Origin(facts.name, turn)

    async def _store(self, scope: str) -> MemoryStore:
        embedder = self._settings.memory_embedder
        return MemoryStore(await self._backend_now(), scope, embedder=embedder)

    async def _call(self, work: Callable[[], Any]) -> Any:
        """Run a blocking store call off the event loop; a broken store is dropped and
        reopened by the next call."""
        try:
            return await asyncio.to_thread(work)
        except MemoryInputError:
            raise
        except Exception as e:
            self._backend = None
            raise self._unavailable(e) from e

    async def _facts(self, fresh: bool = False) -> SessionFacts:
        loaded: Loaded = await self._live.load(fresh=fresh)
        return loaded.facts

    # ------------------------------------------------------------------------------ recall

    async def recall(self, query: str, limit: int) -> dict[str, Any]:
        facts = await self._facts()
        scope = self.scope(facts)
        if scope is None:
            return {"enabled": False, "facts": [], "lines": []}
        store = await self._store(scope)
        hits = await self._call(lambda: store.recall(query, limit=limit))
        return {
            "enabled": True,
            "facts": [h.wire() for h in hits],
            "lines": [h.line() for h in hits],
        }

    async def extract(self, text: str, submission: str) -> dict[str, Any]:
        facts = await self._facts(fresh=True)
        scope = self.scope(facts)
        memory = facts.agent.memory
        if scope is None or memory is None or not memory.extract_after_turn:
            return {"enabled": False, "added": []}
        store = await self._store(scope)
        origin = self.origin(facts, submission)
        found = extract_facts(text)

        def write() -> list[int]:
            known = {(f.subject, f.text) for f in store.facts()}
            return [store.add(s, t, origin) for s, t in found if (s, t) not in known]

        added: list[int] = await self._call(write)
        if added:
            log.info("extracted %d fact(s) into %s from %s", len(added), scope, submission)
        return {"enabled": True, "added": added}

    # ------------------------------------------------------------------------------- tools

    def why_not_offered(self, facts: SessionFacts, name: str) -> str | None:
        if name not in MEMORY_TOOLS:
            return f"there is no memory tool named {name!r}"
        refused = toolmatch.refusal(
            toolmatch.menu_name(name), facts.agent.tools.allow, facts.agent.tools.deny
        )
        if refused is not None:
            return refused
        if self.scope(facts) is None:
            return f"{name} needs memory: the Agent's spec.memory is absent or disabled"
        if not self.configured:
            return f"{name} needs a memory store, and this custodian has none configured"
        return None

    def offered(self, facts: SessionFacts) -> list[MenuTool]:
        return [t for n, t in MEMORY_TOOLS.items() if self.why_not_offered(facts, n) is None]

    async def invoke(self, name: str, tool_input: dict[str, Any], submission: str) -> ToolResult:
        try:
            facts = await self._facts(fresh=True)
        except LiveError as e:
            return ToolResult(str(e), is_error=True)
        refused = self.why_not_offered(facts, name) or _check_input(MEMORY_TOOLS[name], tool_input)
        if refused is not None:
            return ToolResult(refused, is_error=True)
        scope = self.scope(facts)
        assert scope is not None
        origin = self.origin(facts, submission)
        try:
            store = await self._store(scope)
            if name == "memory_add":
                fid = await self._call(
                    lambda: store.add(tool_input["subject"], tool_input["text"], origin)
                )
                answer: dict[str, Any] = {"remembered": fid, "origin": origin.phrase()}
            elif name == "memory_rewrite":
                await self._call(
                    lambda: store.rewrite(tool_input["id"], tool_input["text"], origin)
                )
                answer = {"rewritten": tool_input["id"], "origin": origin.phrase()}
            elif name == "memory_delete":
                await self._call(lambda: store.delete(tool_input["id"]))
                answer = {"forgotten": tool_input["id"]}
            else:
                await self._call(lambda: store.link(tool_input["a"], tool_input["b"]))
                answer = {"linked": [tool_input["a"], tool_input["b"]]}
        except MemoryInputError as e:
            # A fact of another scope reads as absent: its existence is not this agent's to learn.
            return ToolResult(str(e).replace(f" in scope {scope!r}", ""), is_error=True)
        except MemoryUnavailable as e:
            log.warning("memory tool %s failed: %s", name, e)
            return ToolResult(f"memory is unavailable right now: {e}", is_error=True)
        return ToolResult(json.dumps(answer, sort_keys=True))

    async def aclose(self) -> None:
        if self._backend is not None:
            await asyncio.to_thread(self._backend.close)
            self._backend = None
        if self._forwarder is not None:
            await self._forwarder.aclose()
            self._forwarder, self._dsn = None, None


async def _json_object(request: Request, max_bytes: int) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    if len(raw) > max_bytes:
        return _problem(413, "too_large", "the request body is too large")
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return _problem(400, "bad_input", "the body is not JSON")
    if not isinstance(body, dict):
        return _problem(400, "bad_input", "the body must be a JSON object")
    return body


def _unknown_fields(body: dict[str, Any], known: set[str]) -> JSONResponse | None:
    unknown = sorted(set(body) - known)
    if not unknown:
        return None
    return _problem(
        400,
        "bad_input",
        f"unknown field(s) {', '.join(unknown)}: the custodian picks the memory scope itself",
    )


async def _answer(work: Awaitable[dict[str, Any]]) -> Response:
    try:
        return JSONResponse(await work)
    except LiveError as e:
        return _problem(503, "memory_unavailable", str(e))
    except MemoryUnavailable as e:
        log.warning("memory unavailable: %s", e)
        return _problem(503, "memory_unavailable", str(e))


def memory_router(service: MemoryService, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    @router.post("/memory/recall")
    async def recall(request: Request) -> Response:
        body = await _json_object(request, max_body_bytes)
        if isinstance(body, JSONResponse):
            return body
        refused = _unknown_fields(body, {"query", "limit"})
        if refused is not None:
            return refused
        query, limit = body.get("query"), body.get("limit", 5)
        if not isinstance(query, str) or len(query) > MAX_QUERY_CHARS:
            return _problem(400, "bad_input", f"query must be text of at most {MAX_QUERY_CHARS}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            return _problem(400, "bad_input", f"limit must be a whole number from 1 to {MAX_LIMIT}")
        return await _answer(service.recall(query, limit))

    @router.post("/memory/extract")
    async def extract(request: Request) -> Response:
        body = await _json_object(request, max_body_bytes)
        if isinstance(body, JSONResponse):
            return body
        refused = _unknown_fields(body, {"text"})
        if refused is not None:
            return refused
        text = body.get("text")
        if not isinstance(text, str):
            return _problem(400, "bad_input", "text must be the turn's final answer")
        submission = request.headers.get("x-corral-submission", "")
        return await _answer(service.extract(text, submission))

    return router
