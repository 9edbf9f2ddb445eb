"""The harness's side of delivery: the agent's commits reach the custodian as a git bundle the
tools side writes, never as a repository the custodian opens.

Real git, the real `corral-exec` service (and the in-process workspace of `corral run`), and a
real HTTP endpoint standing in for the custodian that records every request and checks the
uploaded bytes with git itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from corral_api.wire import BUNDLE_CONTENT_TYPE
from corral_harness.custodian_client.menu import MenuClient
from corral_harness.delivery import (
    BundleError,
    BundleSender,
    TurnDelivery,
    local_stdout,
)
from corral_harness.ports import Workspace
from corral_harness.tools import LocalWorkspace
from corral_harness.tools._exec_client import ExecWorkspace, StdoutFailed
from tests.unit.tools_exec._service import ExecService

pytestmark = pytest.mark.timeout(60)

CONV = "conv-1"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-qm", f"add {name}")
    return git(repo, "rev-parse", "HEAD")


# ------------------------------------------------------------------------ the stand-in custodian


@dataclass
class Upload:
    revision: str
    content_type: str
    body: bytes
    complete: bool  # the chunked body reached its last chunk


@dataclass
class Custodian:
    """Answers bundle-base with `base`, takes bundles, and records everything in order."""

    base: str | None = None
    refuse: tuple[int, dict[str, str]] | None = None
    calls: list[str] = field(default_factory=list)
    uploads: list[Upload] = field(default_factory=list)
    invoked: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    url: str = ""


def _handler(state: Custodian) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> tuple[bytes, bool]:
            if "chunked" not in self.headers.get("transfer-encoding", ""):
                return self.rfile.read(int(self.headers.get("content-length") or 0)), True
            data = bytearray()
            while True:
                line = self.rfile.readline()
                if not line:
                    return bytes(data), False  # the sender broke off
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(data), True
                chunk = self.rfile.read(size + 2)
                if len(chunk) < size + 2:
                    data += chunk[:size]
                    return bytes(data), False
                data += chunk[:size]

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            state.calls.append(f"GET {path}")
            if path == f"/agents/{CONV}/bundle-base":
                self._answer(200, {"base": state.base, "branch": "corral/s1"})
            else:
                self._answer(404, {"error": "unknown", "reason": path})

        def do_POST(self) -> None:
            parsed = urlparse(self.path)
            state.calls.append(f"POST {parsed.path}")
            body, complete = self._body()
            if parsed.path == f"/agents/{CONV}/bundle":
                revision = parse_qs(parsed.query).get("revision", [""])[0]
                kind = self.headers.get("content-type", "")
                state.uploads.append(Upload(revision, kind, body, complete))
                if not complete:
                    self.close_connection = True
                    return
                if state.refuse is not None:
                    self._answer(*state.refuse)
                    return
                self._answer(200, {"revision": revision, "bytes": len(body)})
            elif parsed.path.startswith(f"/agents/{CONV}/tools/"):
                name = parsed.path.rsplit("/", 1)[1]
                state.invoked.append((name, json.loads(body or b"{}")))
                self._answer(200, {"content": f"{name} done", "isError": False})
            elif parsed.path == f"/agents/{CONV}/deliver":
                state.invoked.append(("deliver", json.loads(body)))
                self._answer(200, {"state": "Delivered"})
            else:
                self._answer(404, {"error": "unknown", "reason": parsed.path})

    return Handler


@pytest.fixture
def custodian() -> Iterator[Custodian]:
    state = Custodian()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------ the workspaces


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    git(root, "init", "-q", "-b", "corral/s1")
    commit(root, "README.md", "# repo\n")
    return root


@pytest.fixture(params=["exec", "local"])
async def workspace(request: pytest.FixtureRequest, repo: Path) -> AsyncIterator[Workspace]:
    """The tools container's exec service (a pod), or the harness itself (`corral run`)."""
    if request.param == "local":
        yield LocalWorkspace(repo)
        return
    socket = repo.parent / "exec.sock"
    service = ExecService(repo, socket, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    exec_workspace = ExecWorkspace(socket, repo)
    try:
        yield exec_workspace
    finally:
        await exec_workspace.aclose()
        service.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


def mirror_with(tmp_path: Path, source: Path, *revisions: str) -> Path:
    """A bare repository holding exactly the history up to `revisions` (none: empty)."""
    mirror = tmp_path / f"mirror-{len(list(tmp_path.glob('mirror-*')))}.git"
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    for revision in revisions:
        git(mirror, "fetch", "-q", str(source), f"{revision}:refs/base/{revision}")
    return mirror


def check_bundle(tmp_path: Path, data: bytes, mirror: Path, tip: str) -> list[str]:
    """git itself reads the uploaded bytes: verify against the mirror, fetch the tip; the
    bundle's prerequisites."""
    path = tmp_path / f"upload-{len(data)}.bundle"
    path.write_bytes(data)
    git(mirror, "bundle", "verify", "-q", str(path))
    git(mirror, "fetch", "-q", str(path), f"{tip}:refs/heads/taken")
    assert git(mirror, "rev-parse", "refs/heads/taken") == tip
    header = data.split(b"\n\n", 1)[0].decode().splitlines()
    return [line[1:41] for line in header if line.startswith("-")]


# ------------------------------------------------------------------------------ the bundle


async def test_a_bundle_of_the_commits_since_the_base_reaches_the_custodian(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient,
    tmp_path: Path,
) -> None:  # fmt: skip
    base = git(repo, "rev-parse", "HEAD")
    commit(repo, "a.txt", "one\n")
    tip = commit(repo, "b.txt", "two\n")
    custodian.base = base
    sent = await BundleSender(workspace, client, custodian.url).send(CONV, tip)

    assert [u.revision for u in custodian.uploads] == [tip]
    upload = custodian.uploads[0]
    assert upload.complete and upload.content_type == BUNDLE_CONTENT_TYPE
    assert (sent.revision, sent.bytes) == (tip, len(upload.body))
    # Only what the custodian lacks: the base is the bundle's one prerequisite.
    assert check_bundle(tmp_path, upload.body, mirror_with(tmp_path, repo, base), tip) == [base]
    assert custodian.calls == [f"GET /agents/{CONV}/bundle-base", f"POST /agents/{CONV}/bundle"]


async def test_with_no_base_the_bundle_holds_the_whole_history(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient,
    tmp_path: Path,
) -> None:  # fmt: skip
    tip = commit(repo, "a.txt", "one\n")
    await BundleSender(workspace, client, custodian.url).send(CONV, tip)
    (upload,) = custodian.uploads
    assert check_bundle(tmp_path, upload.body, mirror_with(tmp_path, repo), tip) == []


async def test_a_base_the_workspace_lacks_means_the_whole_history(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient,
    tmp_path: Path,
) -> None:  # fmt: skip
    tip = commit(repo, "a.txt", "one\n")
    custodian.base = "0123456789abcdef0123456789abcdef01234567"
    await BundleSender(workspace, client, custodian.url).send(CONV, tip)
    (upload,) = custodian.uploads
    assert check_bundle(tmp_path, upload.body, mirror_with(tmp_path, repo), tip) == []


async def test_only_the_tip_is_named_when_the_custodian_holds_every_commit(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient
) -> None:
    older = git(repo, "rev-parse", "HEAD")
    tip = commit(repo, "a.txt", "one\n")
    custodian.base = tip
    sender = BundleSender(workspace, client, custodian.url)
    assert (await sender.send(CONV, tip)).bytes == 0
    assert (await sender.send(CONV, older)).bytes == 0  # an ancestor of the base, too
    # No bundle, but each tip is named: `push` then sends the one the agent is at now.
    assert [(u.revision, u.body) for u in custodian.uploads] == [(tip, b""), (older, b"")]


async def test_a_tip_that_is_not_head_is_bundled_and_its_transient_ref_removed(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient,
    tmp_path: Path,
) -> None:  # fmt: skip
    base = git(repo, "rev-parse", "HEAD")
    wanted = commit(repo, "a.txt", "one\n")
    commit(repo, "b.txt", "two\n")  # HEAD moved on
    custodian.base = base
    await BundleSender(workspace, client, custodian.url).send(CONV, wanted)
    (upload,) = custodian.uploads
    assert upload.revision == wanted
    mirror = mirror_with(tmp_path, repo, base)
    assert check_bundle(tmp_path, upload.body, mirror, wanted) == [base]
    # The bundle carries no commit past the tip it was asked for.
    assert git(mirror, "rev-list", "--all", "--count") == "2"
    assert git(repo, "for-each-ref", "refs/corral") == ""


async def test_a_bundle_past_the_cap_is_broken_off_and_never_complete(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient
) -> None:
    # Random bytes do not compress: a bundle well past a 64 KiB cap.
    (repo / "noise.bin").write_bytes(os.urandom(512 * 1024))
    git(repo, "add", "noise.bin")
    git(repo, "commit", "-qm", "noise")
    tip = git(repo, "rev-parse", "HEAD")
    sender = BundleSender(workspace, client, custodian.url, max_bytes=64 * 1024)
    with pytest.raises(BundleError, match="size cap"):
        await sender.send(CONV, tip)
    # What the custodian saw (if anything) never reached the body's last chunk.
    assert all(not u.complete for u in custodian.uploads), custodian.uploads
    assert all(len(u.body) <= 64 * 1024 for u in custodian.uploads)


async def test_a_git_failure_in_the_workspace_names_git_and_sends_no_bundle(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient
) -> None:
    tip = commit(repo, "a.txt", "one\n")
    # The agent broke its own object store: the tools side's git cannot write the bundle.
    blob = git(repo, "rev-parse", "HEAD:a.txt")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    with pytest.raises(BundleError, match="could not be written"):
        await BundleSender(workspace, client, custodian.url).send(CONV, tip)
    assert all(not u.complete for u in custodian.uploads)


async def test_the_custodians_refusal_is_the_error(
    workspace: Workspace, repo: Path, custodian: Custodian, client: httpx.AsyncClient
) -> None:
    tip = commit(repo, "a.txt", "one\n")
    custodian.refuse = (400, {"error": "bundle_invalid", "reason": "not a bundle"})
    with pytest.raises(BundleError, match="refused the bundle: bundle_invalid: not a bundle"):
        await BundleSender(workspace, client, custodian.url).send(CONV, tip)


# ----------------------------------------------------------------------- stdout as bytes


async def test_both_workspaces_return_stdout_byte_for_byte_and_fail_after_the_last_chunk(
    workspace: Workspace, repo: Path
) -> None:
    script = "printf '\\000\\377\\r\\nend'; echo why >&2; exit 4"
    if isinstance(workspace, ExecWorkspace):
        stream = workspace.stream_stdout(["/bin/sh", "-c", script], timeout=10, max_bytes=1000)
    else:
        stream = local_stdout(repo, ["/bin/sh", "-c", script], timeout=10, max_bytes=1000)
    received = b""
    with pytest.raises(StdoutFailed) as failed:
        async for chunk in stream:
            received += chunk
    assert received == b"\x00\xff\r\nend"
    assert failed.value.exit_code == 4 and failed.value.stderr == "why\n"


async def test_the_local_stdout_stops_at_its_cap_and_its_timeout(repo: Path) -> None:
    with pytest.raises(StdoutFailed) as capped:
        async for _ in local_stdout(repo, ["yes"], timeout=10, max_bytes=100_000):
            pass
    assert capped.value.overflow
    with pytest.raises(StdoutFailed) as slow:
        async for _ in local_stdout(repo, ["sleep", "30"], timeout=0.3, max_bytes=100):
            pass
    assert slow.value.timed_out and slow.value.exit_code == -9


# ------------------------------------------------------------------- the turn and the Menu


async def test_turn_end_commits_then_sends_the_bundle_then_asks_for_delivery(
    workspace: Workspace, repo: Path, custodian: Custodian, tmp_path: Path
) -> None:
    base = git(repo, "rev-parse", "HEAD")
    custodian.base = base
    (repo / "greeting.txt").write_text("hello\n")
    delivery = TurnDelivery(workspace, custodian.url, credential="c")
    try:
        revision = await delivery.end_turn(
            agent="fixer", conversation=CONV, submission="s1", task="Greet.", answer="Done."
        )
    finally:
        await delivery.aclose()
    assert revision == git(repo, "rev-parse", "HEAD") != base
    assert custodian.calls == [
        f"GET /agents/{CONV}/bundle-base",
        f"POST /agents/{CONV}/bundle",
        f"POST /agents/{CONV}/deliver",
    ]
    (upload,) = custodian.uploads
    assert upload.revision == revision
    assert check_bundle(tmp_path, upload.body, mirror_with(tmp_path, repo, base), revision) == [
        base
    ]
    assert custodian.invoked == [("deliver", {"submissionId": "s1", "revision": revision})]


async def test_a_turn_that_changed_nothing_sends_no_bundle_bytes(
    workspace: Workspace, repo: Path, custodian: Custodian
) -> None:
    custodian.base = git(repo, "rev-parse", "HEAD")
    delivery = TurnDelivery(workspace, custodian.url)
    try:
        await delivery.end_turn(
            agent="fixer", conversation=CONV, submission="s1", task="Look.", answer="Nothing."
        )
    finally:
        await delivery.aclose()
    # No bundle: the tip is only named (an empty body), then delivered.
    assert [u.body for u in custodian.uploads] == [b""]
    assert [name for name, _ in custodian.invoked] == ["deliver"]


async def test_push_sends_head_first_and_land_sends_its_revision(
    workspace: Workspace, repo: Path, custodian: Custodian
) -> None:
    base = git(repo, "rev-parse", "HEAD")
    custodian.base = base
    landed = commit(repo, "a.txt", "one\n")
    head = commit(repo, "b.txt", "two\n")
    menu = MenuClient(custodian.url, workspace=workspace)
    try:
        pushed = await menu.invoke(CONV, "mcp__corral__push", {})
        assert not pushed.is_error, pushed
        answer = await menu.invoke(
            CONV, "mcp__corral__land", {"target": "main", "revision": landed}
        )
        assert not answer.is_error, answer
        # A revision the workspace does not have: invoked as it is, the custodian refuses it.
        unknown = "0123456789abcdef0123456789abcdef01234567"
        await menu.invoke(CONV, "mcp__corral__land", {"target": "main", "revision": unknown})
        # Other tools send nothing.
        await menu.invoke(CONV, "mcp__corral__walk_tree", {})
    finally:
        await menu.close()
    assert [u.revision for u in custodian.uploads] == [head, landed]
    assert [name for name, _ in custodian.invoked] == ["push", "land", "land", "walk_tree"]
    # Each bundle went before its tool.
    posts = [c for c in custodian.calls if c.startswith("POST")]
    assert posts == [
        f"POST /agents/{CONV}/bundle",
        f"POST /agents/{CONV}/tools/push",
        f"POST /agents/{CONV}/bundle",
        f"POST /agents/{CONV}/tools/land",
        f"POST /agents/{CONV}/tools/land",
        f"POST /agents/{CONV}/tools/walk_tree",
    ]


async def test_a_push_whose_bundle_is_refused_is_not_invoked(
    workspace: Workspace, repo: Path, custodian: Custodian
) -> None:
    commit(repo, "a.txt", "one\n")
    custodian.refuse = (413, {"error": "bundle_too_large", "reason": "over the cap"})
    menu = MenuClient(custodian.url, workspace=workspace)
    try:
        answer = await menu.invoke(CONV, "mcp__corral__push", {})
    finally:
        await menu.close()
    # The custodian would otherwise push the tip of an earlier bundle, not the agent's HEAD.
    assert answer.is_error and "push was not invoked" in answer.content
    assert "bundle_too_large: over the cap" in answer.content
    assert custodian.invoked == []
