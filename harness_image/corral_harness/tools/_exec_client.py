"""The exec-service workspace: the tools container's `corral-exec`, over a Unix socket.

The harness never opens a workspace path itself in this mode: every file operation, command
and path check is a request to the service, which runs under the tools container's uid and
resolves paths on its own view of the workspace. This module only moves bytes and error kinds;
the words the model reads are made in `tools._result` as for the in-process workspace.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast, get_args

from ..http1 import Http1Client, TransportError
from ..paths import PathVerdict
from ..ports import (
    CommandOutcome,
    DirEntry,
    Fingerprint,
    FoundFile,
    GlobMatches,
    LineWindow,
    PathKind,
    Programs,
    ResolvedPath,
    Survey,
    WorkspaceError,
    WorkspaceErrorKind,
    workspace_text,
)
from ._result import head_tail_text

# Short requests answer quickly; a command's stream is bounded by its own timeout, which the
# service enforces, so the client waits for it without a read timeout of its own.
REQUEST_TIMEOUT_SECONDS = 60.0
HEALTH_TIMEOUT_SECONDS = 2.0
JSON = {"Content-Type": "application/json"}

SUN_PATH_MAX = 108  # struct sockaddr_un's room for a path, NUL included
_KINDS: frozenset[str] = frozenset(get_args(WorkspaceErrorKind))


class StdoutFailed(WorkspaceError):
    """A command run for its stdout did not finish cleanly: it exited non-zero, was killed at
    its timeout, or wrote more than its cap. What it wrote before is not a whole output."""

    def __init__(
        self, exit_code: int, stderr: str, *, timed_out: bool = False, overflow: bool = False
    ) -> None:
        if overflow:
            detail = "its output passed the size cap"
        elif timed_out:
            detail = "it did not finish in time"
        else:
            detail = f"it exited {exit_code}"
        super().__init__("io", f"{detail}: {stderr.strip()[-500:]}" if stderr.strip() else detail)
        self.exit_code = exit_code
        self.stderr = stderr
        self.timed_out = timed_out
        self.overflow = overflow


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


class ExecWorkspace:
    """`Workspace` through the exec service listening on `socket`."""

    def __init__(self, socket: str | Path, root: str | Path) -> None:
        self.socket = str(socket)
        self._root = Path(root)
        self._socket_dir: int | None = None
        self._programs: Programs | None = None
        # The survey generations the service reported after the last command, by file name.
        self._after_command: dict[str, int] = {}
        self._client = Http1Client.unix(self._connectable(self.socket), host="corral-exec")

    def _connectable(self, socket: str) -> str:
        """The socket's path, or for one too long for sockaddr_un (the local node's host paths
        of a volume) the same socket through an open handle on its directory."""
        if len(socket.encode()) < SUN_PATH_MAX:
            return socket
        self._socket_dir = os.open(os.path.dirname(socket), os.O_PATH | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._socket_dir}/{os.path.basename(socket)}"

    @property
    def root(self) -> Path:
        return self._root

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._socket_dir is not None:
            os.close(self._socket_dir)
            self._socket_dir = None

    async def healthy(self) -> bool:
        try:
            status, _ = await self._exchange("GET", "/healthz", None, HEALTH_TIMEOUT_SECONDS)
        except WorkspaceError:
            return False
        return status == 200

    # ------------------------------------------------------------------------- transport

    async def _exchange(
        self, method: str, target: str, body: dict[str, Any] | None, timeout: float
    ) -> tuple[int, bytes]:
        """One short request and its whole answer, within `timeout` seconds."""
        data = None if body is None else json.dumps(body).encode()
        try:
            async with asyncio.timeout(timeout):
                async with self._client.request(method, target, data, headers=JSON) as response:
                    return response.status, await response.read()
        except TransportError as exc:
            raise WorkspaceError("unavailable", str(exc)) from exc
        except TimeoutError as exc:
            raise WorkspaceError("unavailable", f"no answer in {timeout:g} s") from exc

    async def _call(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        status, content = await self._exchange("POST", endpoint, body, REQUEST_TIMEOUT_SECONDS)
        answer = _json(content)
        if status != 200:
            raise _error(answer, status)
        return answer

    # ------------------------------------------------------------------------- paths

    async def classify(self, path: str) -> PathVerdict:
        try:
            return (await self.resolve(path)).verdict
        except WorkspaceError:
            return PathVerdict.UNCERTAIN  # the service cannot say: a person decides, not a guess

    async def resolve(self, path: str) -> ResolvedPath:
        if not _encodable(path):
            return ResolvedPath(PathVerdict.UNCERTAIN, "", "missing")
        answer = await self._call("/v1/files/resolve", {"path": path})
        return ResolvedPath(
            PathVerdict(answer["verdict"]), str(answer["path"]), cast(PathKind, answer["kind"])
        )

    def _checked(self, path: str) -> str:
        if not _encodable(path):
            raise WorkspaceError("uncertain", "the path is not valid UTF-8 or holds NUL")
        return path

    # ------------------------------------------------------------------------- files

    async def read_lines(self, path: str, offset: int, limit: int, max_bytes: int) -> LineWindow:
        answer = await self._call(
            "/v1/files/read",
            {"path": self._checked(path), "offset": offset, "limit": limit, "maxBytes": max_bytes},
        )
        return LineWindow(list(answer["lines"]), bool(answer["more"]), bool(answer["clipped"]))

    async def read_text(self, path: str, max_bytes: int) -> str:
        answer = await self._call(
            "/v1/files/get", {"path": self._checked(path), "maxBytes": max_bytes}
        )
        return str(answer["content"])

    async def write_text(self, path: str, content: str) -> str:
        content.encode("utf-8")  # a lone surrogate fails here, as it does in-process
        answer = await self._call(
            "/v1/files/put", {"path": self._checked(path), "content": content}
        )
        return str(answer["path"])

    async def glob(self, path: str, pattern: str, limit: int) -> GlobMatches:
        answer = await self._call(
            "/v1/files/glob", {"path": self._checked(path), "pattern": pattern, "max": limit}
        )
        return GlobMatches(list(answer["matches"]), bool(answer["more"]))

    async def find(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int
    ) -> list[FoundFile]:
        return _found(await self._call("/v1/files/find", _find_body(name, known, max_bytes)))

    async def list_dir(self, path: str) -> list[DirEntry]:
        answer = await self._call("/v1/files/list", {"path": self._checked(path)})
        return _entries(answer)

    async def survey(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int, since: int = 0
    ) -> Survey:
        body = _find_body(name, known, max_bytes)
        if since:  # only then: a service from before the change signal refuses unknown fields
            body["since"] = since
        answer = await self._call("/v1/files/survey", body)
        generation = int(answer.get("generation") or 0)
        if answer.get("unchanged") is True:
            return Survey([], [], None, generation, unchanged=True)
        head = answer.get("gitHead")
        head = head if isinstance(head, str) else None
        return Survey(_found(answer), _entries(answer), head, generation)

    def survey_generation(self, name: str) -> int | None:
        return self._after_command.get(name)

    # ------------------------------------------------------------------------- commands

    async def run(
        self, argv: Sequence[str], *, timeout: float, keep_bytes: int, cwd: str = "."
    ) -> CommandOutcome:
        body = {
            "argv": list(argv),
            "cwd": self._checked(cwd),
            "timeoutSeconds": timeout,
            "keepBytes": keep_bytes,
        }
        head, tail = bytearray(), bytearray()
        cut = 0
        outcome: CommandOutcome | None = None
        # Until this command's exit event, nothing is known of what it changed.
        self._after_command.clear()
        try:
            # Leaving this block early (the task cancelled: the turn was aborted) closes the
            # connection, and the service kills the command's whole process group.
            async with self._client.request(
                "POST", "/v1/exec", json.dumps(body).encode(), headers=JSON
            ) as response:
                if response.status != 200:
                    raise _error(_json(await response.read()), response.status)
                async for line in response.lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind = event.get("type")
                    if kind == "output":
                        (tail if cut else head).extend(base64.b64decode(event.get("data", "")))
                    elif kind == "cut":
                        cut = int(event["bytes"])
                    elif kind == "exit":
                        surveys = event.get("surveys") or {}
                        self._after_command.update({str(k): int(v) for k, v in surveys.items()})
                        # Read on to the end of the stream (it ends here), so the connection
                        # goes back to the pool instead of being closed.
                        outcome = CommandOutcome(
                            int(event["exitCode"]),
                            head_tail_text(bytes(head), cut, bytes(tail)),
                            bool(event["timedOut"]),
                        )
        except TransportError as exc:
            raise WorkspaceError("unavailable", str(exc)) from exc
        if outcome is None:
            raise WorkspaceError("unavailable", "the command's stream ended without its exit")
        return outcome

    async def stream_stdout(
        self, argv: Sequence[str], *, timeout: float, max_bytes: int, cwd: str = "."
    ) -> AsyncIterator[bytes]:
        """The command's stdout as the service streams it (`/v1/exec/stdout`), every byte,
        chunk by chunk; stderr stays apart. After the last chunk, `StdoutFailed` when the
        command did not exit 0, passed `max_bytes` (the service kills it there) or its timeout,
        so a consumer forwarding the chunks never completes a partial output."""
        body = {
            "argv": list(argv),
            "cwd": self._checked(cwd),
            "timeoutSeconds": timeout,
            "maxBytes": max_bytes,
        }
        try:
            # Leaving early (the consumer stopped, the task was cancelled) closes the
            # connection, and the service kills the command's process group.
            async with self._client.request(
                "POST", "/v1/exec/stdout", json.dumps(body).encode(), headers=JSON
            ) as response:
                if response.status != 200:
                    raise _error(_json(await response.read()), response.status)
                exit_event: dict[str, Any] | None = None
                async for line in response.lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind = event.get("type")
                    if kind == "stdout" and exit_event is None:
                        yield base64.b64decode(event.get("data", ""))
                    elif kind == "exit":
                        # Read on to the end of the stream (it ends here): the connection
                        # goes back to the pool.
                        exit_event = event
        except TransportError as exc:
            raise WorkspaceError("unavailable", str(exc)) from exc
        if exit_event is None:
            raise WorkspaceError("unavailable", "the command's stream ended without its exit")
        code = int(exit_event["exitCode"])
        timed_out = bool(exit_event.get("timedOut"))
        overflow = bool(exit_event.get("overflow"))
        if code != 0 or timed_out or overflow:
            stderr = base64.b64decode(exit_event.get("stderr", ""))
            raise StdoutFailed(code, workspace_text(stderr), timed_out=timed_out, overflow=overflow)

    async def run_with_stdin(
        self, argv: Sequence[str], data: bytes, *, timeout: float, max_bytes: int, cwd: str = "."
    ) -> CommandOutcome:
        """Run argv with `data` on its stdin (`/v1/exec/stdin`: one line of JSON, then the
        bytes); stdout and stderr come back together, their last bytes only. More than
        `max_bytes` of data is refused before anything runs."""
        if len(data) > max_bytes:
            raise WorkspaceError("too_large", f"{len(data)} bytes for stdin, over {max_bytes}")
        head = {
            "argv": list(argv),
            "cwd": self._checked(cwd),
            "timeoutSeconds": timeout,
            "maxBytes": max_bytes,
        }
        body = json.dumps(head).encode() + b"\n" + data
        headers = {"Content-Type": "application/octet-stream"}
        try:
            async with self._client.request(
                "POST", "/v1/exec/stdin", body, headers=headers
            ) as response:
                answer = _json(await response.read())
                if response.status != 200:
                    raise _error(answer, response.status)
        except TransportError as exc:
            raise WorkspaceError("unavailable", str(exc)) from exc
        output = workspace_text(base64.b64decode(answer.get("output") or ""))
        return CommandOutcome(int(answer["exitCode"]), output, bool(answer.get("timedOut")))

    async def programs(self) -> Programs:
        if self._programs is None:
            _, content = await self._exchange("GET", "/healthz", None, REQUEST_TIMEOUT_SECONDS)
            answer = _json(content)
            self._programs = Programs(str(answer["shell"]), answer.get("ripgrep") or None)
        return self._programs


def _find_body(name: str, known: Mapping[str, Fingerprint], max_bytes: int) -> dict[str, Any]:
    return {
        "name": name,
        "known": {p: {"size": s, "mtimeNs": m} for p, (s, m) in known.items()},
        "maxBytes": max_bytes,
    }


def _found(answer: dict[str, Any]) -> list[FoundFile]:
    return [
        FoundFile(f["path"], int(f["size"]), int(f["mtimeNs"]), f.get("content"))
        for f in answer["files"]
    ]


def _entries(answer: dict[str, Any]) -> list[DirEntry]:
    return [DirEntry(e["name"], cast(PathKind, e["kind"])) for e in answer["entries"]]


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _error(answer: dict[str, Any], status: int) -> WorkspaceError:
    kind = str(answer.get("error", ""))
    reason = str(answer.get("reason", f"HTTP {status}"))
    if kind not in _KINDS:
        return WorkspaceError("io", f"{kind or 'error'}: {reason}")
    return WorkspaceError(cast(WorkspaceErrorKind, kind), reason)
