"""Work in progress: the workspace between deliveries, as a git bundle that can leave the pod.

A turn's work reaches the Session's branch at the turn's end (delivery.py). A pod lost in the
middle of a long turn would lose what the agent did since; so while a turn is in flight the
operator asks for a snapshot every `Agent.spec.workspace.wipIntervalSeconds` (`GET .../wip`)
and keeps the newest in its archive, never on the remote (docs/turns.md, "A lost pod").

The snapshot is made in the tools container, as the agent's uid, through the exec service, the
same path as delivery: the working tree is recorded as a commit on top of HEAD through an index
of its own (the agent's index, HEAD and branches are untouched; ignored files stay out, as
`git add -A` leaves them), and a bundle of it and the commits since the base is written to the
tools side's stdout, which the harness streams to the operator a chunk at a time. The base is
the custodian's bundle base: the revision the Session's next pod is checked out at.

In the next pod (`PUT .../wip?revision=R`), the bundle's bytes go to the tools side's stdin
(`/v1/exec/stdin`): `git bundle unbundle` takes its objects (it refuses a bundle whose base the
checkout lacks), then R's tree is checked out over the worktree and the index reset to HEAD, so
the agent finds its changes uncommitted, as it left them. It runs before the pod's first turn,
on the tree the checkout has just made.

Every git command here has the checkout's own hardening (corral_common.checkout: no system or
global configuration, no hooks, no fsmonitor, no `ext::` transport): a configuration the agent
left in its HOME, or one the bundle itself brings back, is not read while the snapshot is taken
or the bundle's files are written (a clean or smudge filter it names never runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from corral_common.checkout import CHECKOUT_GIT_ENV

from .delivery import BUNDLE_MAX_BYTES, BUNDLE_TIMEOUT, GIT, StdoutSource, local_stdout
from .ports import CommandOutcome, Workspace, workspace_text
from .tools._local import child_env

__all__ = ["BUNDLE_MAX_BYTES", "Snapshot", "StdinSink", "WipError", "apply", "bundle", "snapshot"]

GIT_TIMEOUT = 60.0
_KEEP = 16_000
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# The ref naming the snapshot while its bundle is written (`git bundle create` takes ref names).
WIP_REF = "refs/corral/wip"
# The snapshot's own index, in the repository's git directory (never the agent's index).
_INDEX = "corral-wip-index"
_IDENT = ("-c", "user.name=corral", "-c", "user.email=wip@agents.corral.invalid")
# The checkout's environment and protected command line (module docstring).
_GIT = (
    "env",
    *(f"{k}={v}" for k, v in CHECKOUT_GIT_ENV),
    *GIT,
    "-c",
    "protocol.ext.allow=never",
)


class WipError(Exception):
    """A snapshot or an apply that did not work; the reason, for the log and the answer."""


@dataclass(frozen=True)
class Snapshot:
    revision: str  # the work-in-progress commit (HEAD plus the working tree)
    base: str | None  # the commit the bundle starts after; None: it holds the whole history


@runtime_checkable
class StdinSink(Protocol):
    """A workspace that runs a command with bytes on its stdin (the exec service)."""

    async def run_with_stdin(
        self, argv: Sequence[str], data: bytes, *, timeout: float, max_bytes: int
    ) -> CommandOutcome: ...


async def _git(workspace: Workspace, *args: str) -> tuple[int, str]:
    outcome = await workspace.run([*_GIT, *args], timeout=GIT_TIMEOUT, keep_bytes=_KEEP)
    return outcome.exit_code, outcome.output.strip()


async def snapshot(workspace: Workspace, base: str | None) -> Snapshot | None:
    """Record the working tree as a commit on top of HEAD; None when the workspace is not a
    repository, or holds nothing beyond `base` (HEAD is the base and the tree is unchanged)."""
    code, head = await _git(workspace, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    if code != 0 or not _FULL_SHA.match(head):
        return None
    code, index = await _git(workspace, "rev-parse", "--git-path", _INDEX)
    if code != 0:
        raise WipError(f"the repository's git directory is not found: {index[-300:]}")
    own_index = ("env", f"GIT_INDEX_FILE={index}")
    try:
        for step in (("read-tree", "HEAD"), ("add", "-A")):
            outcome = await workspace.run(
                [*own_index, *_GIT, *step], timeout=GIT_TIMEOUT, keep_bytes=_KEEP
            )
            if outcome.exit_code != 0:
                raise WipError(f"git {step[0]} failed: {outcome.output.strip()[-300:]}")
        tree = await workspace.run(
            [*own_index, *_GIT, "write-tree"], timeout=GIT_TIMEOUT, keep_bytes=_KEEP
        )
    finally:
        await workspace.run(["rm", "-f", index], timeout=GIT_TIMEOUT, keep_bytes=_KEEP)
    tree_id = tree.output.strip()
    if tree.exit_code != 0 or not _FULL_SHA.match(tree_id):
        raise WipError(f"git write-tree failed: {tree_id[-300:]}")
    known_base = await _commit(workspace, base) if base else None
    code, head_tree = await _git(workspace, "rev-parse", "HEAD^{tree}")
    if known_base == head and code == 0 and head_tree == tree_id:
        return None  # nothing beyond what the next pod is checked out at
    code, revision = await _git(
        workspace, *_IDENT, "commit-tree", tree_id, "-p", head, "-m", "corral: work in progress"
    )
    if code != 0 or not _FULL_SHA.match(revision):
        raise WipError(f"git commit-tree failed: {revision[-300:]}")
    return Snapshot(revision, known_base)


async def _commit(workspace: Workspace, revision: str) -> str | None:
    if revision.startswith("-"):
        return None
    code, out = await _git(workspace, "rev-parse", "--verify", "-q", f"{revision}^{{commit}}")
    return out if code == 0 and _FULL_SHA.match(out) else None


async def bundle(workspace: Workspace, shot: Snapshot) -> AsyncIterator[bytes]:
    """The bundle of `shot`, chunk by chunk, from the tools side's stdout (at most
    BUNDLE_MAX_BYTES: past it the command is killed and `StdoutFailed` raised)."""
    code, out = await _git(workspace, "update-ref", "--no-deref", WIP_REF, shot.revision)
    if code != 0:
        raise WipError(f"the snapshot could not be named: {out[-300:]}")
    argv = [*_GIT, "bundle", "create", "-", WIP_REF]
    if shot.base is not None:
        argv.append(f"^{shot.base}")
    try:
        if isinstance(workspace, StdoutSource):
            chunks = workspace.stream_stdout(
                argv, timeout=BUNDLE_TIMEOUT, max_bytes=BUNDLE_MAX_BYTES
            )
        else:
            chunks = local_stdout(
                workspace.root, argv, timeout=BUNDLE_TIMEOUT, max_bytes=BUNDLE_MAX_BYTES
            )
        async for chunk in chunks:
            yield chunk
    finally:
        await _git(workspace, "update-ref", "-d", WIP_REF)


async def apply(workspace: Workspace, data: bytes, revision: str, base: str | None) -> None:
    """Unbundle `data` and check `revision`'s tree out over the worktree, HEAD and the index
    left where they are (the changes uncommitted); WipError naming what failed. With a `base`,
    HEAD must be it: a work in progress laid over a later checkout would undo that work."""
    if not _FULL_SHA.match(revision):
        raise WipError(f"{revision!r} is not a full commit id")
    if base is not None:
        code, head = await _git(workspace, "rev-parse", "--verify", "-q", "HEAD^{commit}")
        if code != 0 or head != base:
            raise WipError(f"the checkout is at {head[:12] or 'nothing'}, not its base {base[:12]}")
    argv = [*_GIT, "bundle", "unbundle", "/dev/stdin"]
    if isinstance(workspace, StdinSink):
        outcome = await workspace.run_with_stdin(
            argv, data, timeout=BUNDLE_TIMEOUT, max_bytes=BUNDLE_MAX_BYTES
        )
        code, out = outcome.exit_code, outcome.output
    else:
        code, out = await _local_stdin(workspace, argv, data)
    if code != 0 or revision not in out:
        raise WipError(f"the bundle was not taken: {out.strip()[-300:]}")
    for step in (("read-tree", "-m", "-u", "HEAD", revision), ("reset", "-q")):
        code, out = await _git(workspace, *step)
        if code != 0:
            raise WipError(f"git {step[0]} failed: {out[-300:]}")


async def _local_stdin(workspace: Workspace, argv: Sequence[str], data: bytes) -> tuple[int, str]:
    """`run_with_stdin` in this process, on the granted root (the local mode)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=workspace.root,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=child_env(),
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(data), BUNDLE_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return -9, "timed out"
    return proc.returncode or 0, workspace_text(out[-_KEEP:])
