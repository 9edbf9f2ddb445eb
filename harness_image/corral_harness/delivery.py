"""The end of a turn: commit what the agent left, then hand the commits to the custodian.

The commit runs through the `Workspace` port, so in a pod it runs in the tools container as
the agent's uid (the exec service), never in the custodian, which holds the credentials: the
agent's hooks, `core.fsmonitor` and filters may run there, and that is the agent's own
sandbox. The commits then reach the custodian as data, never as a repository it would open:
the tools side writes a git bundle of the commits since the base the custodian names
(`GET /agents/{c}/bundle-base`) to its stdout, and the harness streams those bytes to
`POST /agents/{c}/bundle?revision=<tip>` chunk by chunk, holding no more than a chunk. The
custodian checks the bundle, unpacks it into its own mirror and pushes the revision the
harness named (`corral_custodian._delivery`, docs/delivery.md). A symlink the agent planted in
`.git` is resolved by the tools uid, which holds no credential to point it at. The Menu's
`push` and `land` send a bundle the same way before they are invoked (`custodian_client.menu`).
Without an exec service (`corral run`, the wire tests) the harness runs git itself on the
granted root, as its in-process workspace does; without a custodian the commit stays on the
local branch.

The commit's author is the agent (`<agent> <agent@agents.corral.invalid>`), its message the
task's first line and the turn's answer; `--no-verify` and `core.hooksPath=/dev/null`, since a
commit the harness makes on the agent's behalf should not be vetoed or rewritten by a hook the
agent planted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from corral_api.wire import BUNDLE_CONTENT_TYPE, BundleAccepted, BundleBase

from .ports import Workspace, WorkspaceError, workspace_text
from .tools._exec_client import StdoutFailed
from .tools._local import child_env

log = logging.getLogger(__name__)

GIT_TIMEOUT = 60.0
SUBJECT_LIMIT = 72
ANSWER_LIMIT = 4000
_KEEP = 64_000
# The custodian's own cap on a bundle (its default); the tools side stops writing past it.
BUNDLE_MAX_BYTES = 64 * 1024 * 1024
BUNDLE_TIMEOUT = 300.0
_CHUNK = 256 * 1024
_STDERR_KEEP = 8 * 1024
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# A ref naming a tip that is not HEAD while its bundle is written (`git bundle create` takes
# only ref names): in the agent's own repository, removed again at once.
_BUNDLE_REF = "refs/corral/bundle-tip"
# Protected configuration (the command line) that the agent's repository cannot override:
# the workspace's top directory may belong to another uid (the volume's), and the harness's
# own commit runs no hook.
_GIT = (
    "git",
    "-c", "safe.directory=*",
    "-c", "core.hooksPath=/dev/null",
    "-c", "commit.gpgSign=false",
    "-c", "core.fsmonitor=false",
)  # fmt: skip
GIT = _GIT  # the same protected command line, for the work in progress (wip.py)


@dataclass(frozen=True)
class Committed:
    revision: str | None  # HEAD after the commit; None when the root is not in a repository
    changed: bool  # this turn left changes that are now committed


def commit_message(task: str, answer: str, conversation: str, submission: str) -> str:
    """The subject is the task's first line, the body the turn's answer, then trailers."""
    first = next((line.strip() for line in task.splitlines() if line.strip()), "agent turn")
    subject = first if len(first) <= SUBJECT_LIMIT else first[: SUBJECT_LIMIT - 3] + "..."
    body = answer.strip()
    if len(body) > ANSWER_LIMIT:
        body = body[: ANSWER_LIMIT - 3] + "..."
    parts = [subject]
    if body:
        parts.append(body)
    parts.append(f"Corral-Session: {conversation}\nCorral-Submission: {submission}")
    return "\n\n".join(parts) + "\n"


def task_of(transcript: list[dict[str, Any]]) -> str:
    """The conversation's first user text: the task the session was started with."""
    for message in transcript:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        for block in content or []:
            if isinstance(block, dict) and block.get("type") == "text":
                return str(block.get("text", ""))
    return ""


class BundleError(Exception):
    """The commits could not be handed to the custodian; the text says why (the tools side's
    own git output, or the custodian's redacted refusal)."""


@runtime_checkable
class StdoutSource(Protocol):
    """A workspace that runs a command for its stdout as bytes (the exec service)."""

    def stream_stdout(
        self, argv: Sequence[str], *, timeout: float, max_bytes: int, cwd: str = "."
    ) -> AsyncIterator[bytes]: ...


async def local_stdout(
    root: Path, argv: Sequence[str], *, timeout: float, max_bytes: int
) -> AsyncIterator[bytes]:
    """`StdoutSource.stream_stdout` in this process, on `root`: the local mode (no exec
    service), where the harness already works on the granted root itself. Same contract: every
    byte, at most `max_bytes` (the group is killed there), `StdoutFailed` after the last chunk
    when the command did not finish cleanly."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr_pipe = proc.stderr
    tail = bytearray()

    async def drain_stderr() -> None:
        while chunk := await stderr_pipe.read(4096):
            tail.extend(chunk)
            del tail[: max(0, len(tail) - _STDERR_KEEP)]

    stderr_task = asyncio.ensure_future(drain_stderr())
    deadline = asyncio.get_running_loop().time() + timeout
    sent, timed_out, overflow = 0, False, False
    try:
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                chunk = await asyncio.wait_for(proc.stdout.read(_CHUNK), max(left, 0))
            except TimeoutError:
                timed_out = True
                break
            if not chunk:
                break
            if sent + len(chunk) > max_bytes:
                overflow = True
                break
            sent += len(chunk)
            yield chunk
        if not (timed_out or overflow):
            try:
                left = deadline - asyncio.get_running_loop().time()
                await asyncio.wait_for(proc.wait(), max(left, 0.1))
            except TimeoutError:
                timed_out = True  # stdout closed, the command still running
    finally:
        if proc.returncode is None:  # over the cap or the time, or the consumer stopped
            await _end(proc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stderr_task, 2)  # its last words, once it has ended
    code = -9 if timed_out or overflow else (proc.returncode or 0)
    if code != 0 or timed_out or overflow:
        raise StdoutFailed(
            code, workspace_text(bytes(tail)), timed_out=timed_out, overflow=overflow
        )


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill the command's group and reap it. Its stdout is read to its end and dropped: asyncio
    reaps a child only once its pipes are closed, and a full pipe would never close."""
    _kill_group(proc.pid)
    stdout = proc.stdout

    async def drain() -> None:
        while stdout is not None and await stdout.read(_CHUNK):
            pass
        await proc.wait()

    with contextlib.suppress(Exception):
        await asyncio.wait_for(drain(), 2)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass(frozen=True)
class BundleSent:
    revision: str  # the tip the custodian now holds
    bytes: int  # the bundle's size; 0 when the custodian already held every commit


class BundleSender:
    """Hands the custodian the commits it lacks up to a tip, as a bundle the tools side writes.

    The bundle's bytes go from the tools side's stdout (the exec service's `/v1/exec/stdout`)
    straight into the upload's body, a chunk at a time: the harness never opens a workspace
    path, and nothing is written to the tools container's /tmp, which is the agent's.
    """

    def __init__(
        self,
        workspace: Workspace,
        client: Any,  # an httpx.AsyncClient carrying the pod-local credential
        base_url: str,
        *,
        max_bytes: int = BUNDLE_MAX_BYTES,
    ) -> None:
        self._workspace = workspace
        self._client = client
        self._url = base_url.rstrip("/")
        self._max_bytes = max_bytes
        self._httpx: Any = importlib.import_module("httpx")

    async def _git(self, *args: str) -> tuple[int, str]:
        outcome = await self._workspace.run([*_GIT, *args], timeout=GIT_TIMEOUT, keep_bytes=_KEEP)
        return outcome.exit_code, outcome.output.strip()

    async def commit_of(self, revision: str) -> str | None:
        """The full id of the commit `revision` names in the workspace; None when it names
        none there."""
        if not revision or revision.startswith("-"):
            return None
        code, out = await self._git("rev-parse", "--verify", "-q", f"{revision}^{{commit}}")
        return out if code == 0 and _FULL_SHA.match(out) else None

    async def base(self, conversation: str) -> BundleBase:
        try:
            answer = await self._client.get(f"{self._url}/agents/{conversation}/bundle-base")
        except self._httpx.HTTPError as exc:
            raise BundleError(f"the custodian is unreachable: {exc}") from exc
        if answer.status_code != 200:
            raise BundleError(f"the custodian refused: {_refusal(answer)}")
        try:
            return BundleBase.model_validate_json(answer.content)
        except ValueError as exc:
            raise BundleError("the custodian's bundle base is malformed") from exc

    async def send(self, conversation: str, tip: str, *, is_head: bool | None = None) -> BundleSent:
        """Make sure the custodian holds `tip` (a full commit id the workspace has): a bundle
        of the commits since its base, or none when it holds them all already. `is_head`: the
        caller just read HEAD as `tip` (None: look)."""
        known = (await self.base(conversation)).base
        exclude: list[str] = []
        if known is not None:
            code, count = await self._git("rev-list", "--count", tip, f"^{known}", "--")
            if code == 0 and count == "0":
                # The custodian holds every commit up to tip: an empty body names it all the
                # same, so `push` sends this tip and not an older, newer or rewritten-away one.
                return await self._upload(conversation, tip, None)
            if code == 0:
                exclude = [f"^{known}"]
            # Otherwise the workspace lacks the base (a fresh checkout after a restart, say):
            # the whole history of the tip, and the custodian checks descent as always.
        if is_head is None:
            code, head = await self._git("rev-parse", "--verify", "-q", "HEAD^{commit}")
            is_head = code == 0 and head == tip
        # HEAD moving in between (the agent's own background process) only makes a bundle
        # without `tip`, which the custodian refuses as not sent.
        ref = "HEAD" if is_head else _BUNDLE_REF
        if ref == _BUNDLE_REF:
            code, out = await self._git("update-ref", "--no-deref", _BUNDLE_REF, tip)
            if code != 0:
                raise BundleError(f"the bundle could not be written: {out[-300:]}")
        try:
            return await self._upload(conversation, tip, [ref, *exclude])
        finally:
            if ref == _BUNDLE_REF:
                await self._git("update-ref", "-d", _BUNDLE_REF)

    def _bundle_bytes(self, revs: list[str]) -> AsyncIterator[bytes]:
        argv = [*_GIT, "bundle", "create", "-", *revs]
        if isinstance(self._workspace, StdoutSource):
            return self._workspace.stream_stdout(
                argv, timeout=BUNDLE_TIMEOUT, max_bytes=self._max_bytes
            )
        return local_stdout(
            self._workspace.root, argv, timeout=BUNDLE_TIMEOUT, max_bytes=self._max_bytes
        )

    async def _upload(self, conversation: str, tip: str, revs: list[str] | None) -> BundleSent:
        """Send a bundle of `revs` naming `tip`; None: no bundle, `tip` only."""
        chunks: AsyncIterator[bytes] | bytes = b"" if revs is None else self._bundle_bytes(revs)
        try:
            # A bundle that fails half-way raises out of the body's iterator: the request is
            # broken off before its last chunk, so the custodian never takes a partial bundle.
            answer = await self._client.post(
                f"{self._url}/agents/{conversation}/bundle",
                params={"revision": tip},
                content=chunks,
                headers={"content-type": BUNDLE_CONTENT_TYPE},
            )
        except StdoutFailed as exc:
            raise BundleError(f"the bundle could not be written: {exc.detail}") from exc
        except WorkspaceError as exc:
            raise BundleError(f"the bundle could not be written: {exc}") from exc
        except self._httpx.HTTPError as exc:
            raise BundleError(f"the bundle's upload to the custodian failed: {exc}") from exc
        finally:
            # An upload broken off early leaves the stream unfinished: closing it ends the
            # command (the exec service kills its group when the connection goes).
            close = getattr(chunks, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        if answer.status_code != 200:
            raise BundleError(f"the custodian refused the bundle: {_refusal(answer)}")
        try:
            accepted = BundleAccepted.model_validate_json(answer.content)
        except ValueError as exc:
            raise BundleError("the custodian's answer to the bundle is malformed") from exc
        return BundleSent(accepted.revision, accepted.bytes)


def _refusal(answer: Any) -> str:
    """The custodian's `{error, reason}` (it passed its redactor), bounded."""
    try:
        body = answer.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("reason"):
        text = f"{body['error']}: {body['reason']}" if body.get("error") else str(body["reason"])
    elif isinstance(body, dict) and body.get("detail"):
        text = str(body["detail"])
    else:
        text = f"HTTP {answer.status_code}"
    return text[:500]


class TurnDelivery:
    """Commit in the workspace, then hand the commit to the custodian (when there is one)."""

    def __init__(
        self,
        workspace: Workspace,
        custodian_url: str | None,
        *,
        credential: str | None = None,
        timeout: float = 180.0,
    ) -> None:
        self._workspace = workspace
        self._url = custodian_url.rstrip("/") if custodian_url else None
        self._client: Any = None
        self._bundles: BundleSender | None = None
        if self._url:
            self._httpx: Any = importlib.import_module("httpx")
            headers = {"authorization": f"Bearer {credential}"} if credential else {}
            self._client = self._httpx.AsyncClient(timeout=timeout, headers=headers)
            self._bundles = BundleSender(workspace, self._client, self._url)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def bundle_base(self, conversation: str) -> str | None:
        """The revision the custodian's bundles start after (its last push, or the starting
        ref's commit); None without a custodian. BundleError when it cannot say."""
        if self._bundles is None:
            return None
        return (await self._bundles.base(conversation)).base

    async def _git(self, *args: str) -> tuple[int, str]:
        outcome = await self._workspace.run([*_GIT, *args], timeout=GIT_TIMEOUT, keep_bytes=_KEEP)
        return outcome.exit_code, outcome.output.strip()

    async def commit(self, agent: str, message: str) -> Committed:
        """Commit everything the agent left (new, changed and deleted files) as the agent."""
        code, inside = await self._git("rev-parse", "--is-inside-work-tree")
        if code != 0 or inside != "true":
            return Committed(None, False)
        code, changes = await self._git("status", "--porcelain", "--untracked-files=all")
        changed = code == 0 and bool(changes)
        if changed:
            ident = ("-c", f"user.name={agent}", "-c", f"user.email={agent}@agents.corral.invalid")
            code, out = await self._git("add", "-A")
            if code == 0:
                code, out = await self._git(
                    *ident, "commit", "-q", "--no-verify", "--allow-empty-message", "-m", message
                )
            if code != 0:
                log.warning("the turn's commit failed: %s", out[-500:])
                changed = False
        code, head = await self._git("rev-parse", "--verify", "-q", "HEAD^{commit}")
        return Committed(head if code == 0 and len(head) == 40 else None, changed)

    async def deliver(self, conversation: str, submission: str, revision: str | None) -> None:
        """Hand the custodian the commits up to `revision`, then ask it to push `revision`; its
        record says how that went (the operator reads it), so a failure here is logged, not
        raised: a bundle that did not arrive leaves the custodian without the revision, and
        its record says so."""
        if self._client is None or self._bundles is None:
            return
        if revision is not None:
            try:
                await self._bundles.send(conversation, revision, is_head=True)
            except BundleError as exc:
                log.warning("the turn's commits were not handed over: %s", exc)
        body: dict[str, Any] = {"submissionId": submission}
        if revision is not None:
            body["revision"] = revision
        try:
            answer = await self._client.post(
                f"{self._url}/agents/{conversation}/deliver", json=body
            )
            if answer.status_code != 200:
                log.warning("delivery refused (%s): %s", answer.status_code, answer.text[:300])
        except self._httpx.HTTPError as exc:
            log.warning("delivery failed: the custodian is unreachable: %s", exc)

    async def end_turn(
        self, *, agent: str, conversation: str, submission: str, task: str, answer: str
    ) -> str | None:
        """Commit and deliver; the revision delivered (None: no repository)."""
        message = commit_message(task, answer, conversation, submission)
        try:
            committed = await self.commit(agent, message)
        except WorkspaceError as exc:
            log.warning("the turn's commit could not run: %s", exc)
            return None
        if committed.revision is None:
            return None
        await self.deliver(conversation, submission, committed.revision)
        return committed.revision
