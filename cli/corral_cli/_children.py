"""Child sessions under `corral run`: each its own harness and custodian, by the cluster's rules.

`corral run` stands in for the API server and the operator here (docs/children.md). The
session tree is a directory of Session documents (`corral_common.session_files`): the root's is
written at the start, a custodian's `spawn_child` writes a child's (the manifest it would send
to a cluster), and `SessionTree` runs each new one as its own `LocalRun`, as the operator runs
each child in its own pod. The rules are the operator's own pure functions: the turn cap and
depth from `derive_lineage`, the wait from `wait_satisfied`, the one line per child from
`children_report`, a session that would succeed with children running held by
`hold_for_children`.

A child works in its own clone of its parent's workspace, checked out at the revision the
parent's spawn committed, on its own branch `corral/<child>`; never in the parent's directory.
When it ends, its branch (and those of its own children) is fetched into the parent's
repository, so the parent finds the child's work there, and its `status.delivery` names them.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from corral_api import Agent, Session
from corral_api.timestamps import now_rfc3339
from corral_common.branches import session_refusal
from corral_common.session_files import SessionFiles
from corral_operator.driver import DriverState, hold_for_children, wait_satisfied
from corral_operator.planning.lineage import (
    LineageRefusal,
    derive_lineage,
    out_of_turns_message,
)

from ._localstore import LocalTurnStore
from ._view import View

NAMESPACE = "local"
POLL_SECONDS = 0.2
_GIT_IDENTITY = ["-c", "user.name=corral", "-c", "user.email=corral@localhost"]


class ChildWorkspaceError(Exception):
    pass


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ChildWorkspaceError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def clone_for_child(parent_workspace: Path, dest: Path, ref: str, branch: str) -> Path:
    """The child's own clone of its parent's repository, at `ref`, on `branch`."""
    if dest.exists() and any(dest.iterdir()):
        return dest  # a resumed run keeps its workspace
    dest.parent.mkdir(parents=True, exist_ok=True)
    _git(parent_workspace.parent, "clone", "-q", "--no-checkout", str(parent_workspace), str(dest))
    _git(dest, "checkout", "-q", "-b", branch, ref)
    return dest


def fetch_branches(into: Path, source: Path, branches: list[str]) -> None:
    """Bring `branches` of `source` into the repository `into` (forced: each is the child's own
    branch, which only the child writes)."""
    specs = [f"+refs/heads/{b}:refs/heads/{b}" for b in branches]
    _git(into, "fetch", "-q", str(source), *specs)


class TreeTurnStore(LocalTurnStore):
    """The local turn store of a session in the tree: `state.json` as ever, and the status in
    the session's document, as the operator's store writes a Session's status; a session about
    to succeed with children running waits for them (the operator's rule)."""

    def __init__(
        self, state_dir: Path, tree: SessionTree, name: str, uid: str, *, child: bool
    ) -> None:
        super().__init__(state_dir)
        self._tree = tree
        self._name = name
        self._uid = uid
        # A child's end is published with its delivery (`SessionTree._deliver`), never before:
        # its parent's line for it names the branch and revision.
        self._child = child

    async def save(self, state: DriverState) -> None:
        hold_for_children(state, self._tree.files.children_of(self._uid))
        await super().save(state)
        status = state.status_patch()
        if self._child and state.finished:
            status["phase"] = "Running"
            status["finishedAt"] = None
        self._tree.write_status(self._name, status)


class SessionTree:
    """The sessions of one `corral run`, and the children running among them."""

    def __init__(
        self,
        directory: Path,
        agents: dict[str, Agent],
        view: View,
        run_child: Callable[[Session, Agent, int, Path, Path], Awaitable[str]],
    ) -> None:
        self.files = SessionFiles(directory)
        self._agents = agents
        self._view = view
        # Starts one child (session, capped Agent, turn cap, workspace, state dir); its phase.
        self._run_child = run_child
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.workspaces: dict[str, Path] = {}
        self.state_root = directory.parent / "children"

    def add_root(self, session: Session, workspace: Path) -> dict[str, Any]:
        """The root Session's document (kept when a resumed run finds it)."""
        name = str(session.metadata["name"])
        self.workspaces[name] = workspace
        found = self.files.get(name)
        if found is not None:
            return found
        body = session.model_dump(by_alias=True, exclude_none=True, mode="json")
        body["metadata"] = {**body.get("metadata", {}), "namespace": NAMESPACE, "name": name}
        body["metadata"].pop("uid", None)
        uid = session.metadata.get("uid")
        if uid:
            body["metadata"]["uid"] = str(uid)
        return self.files.create(body)

    def write_status(self, name: str, status: dict[str, Any]) -> None:
        body = self.files.get(name)
        if body is None:
            return
        kept = {k: v for k, v in (body.get("status") or {}).items() if k == "delivery"}
        self.files.write_status(name, {**status, **kept})

    # ------------------------------------------------------------------------- the watch

    async def watch(self) -> None:
        """Start every new child as soon as its document appears (as the operator's watch)."""
        while True:
            for body in self.files.every():
                name = str(body["metadata"]["name"])
                phase = (body.get("status") or {}).get("phase") or "Pending"
                parent = (body.get("spec") or {}).get("parentRef")
                if parent and phase == "Pending" and name not in self._tasks:
                    self._tasks[name] = asyncio.create_task(self._child(body), name=name)
            await asyncio.sleep(POLL_SECONDS)

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _fail(self, name: str, message: str) -> None:
        self.files.write_status(
            name, {"phase": "Failed", "message": message, "turns": 0, "finishedAt": now_rfc3339()}
        )
        self._view.event(
            {"source": "driver", "type": "finished", "session": name, "phase": "Failed",
             "message": message}
        )  # fmt: skip

    def _chain(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The Sessions up `parentRef`, nearest first, as far as they are found."""
        chain: list[dict[str, Any]] = []
        ref = (body.get("spec") or {}).get("parentRef")
        while ref and len(chain) < 8:
            parent = self.files.get(str(ref.get("name", "")))
            if parent is None:
                break
            chain.append(parent)
            ref = (parent.get("spec") or {}).get("parentRef")
        return chain

    async def _child(self, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        try:
            await self._start_child(body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the child fails with the reason; the tree goes on
            self._fail(name, f"the child could not run: {exc}")

    async def _start_child(self, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        try:
            session = Session.model_validate(
                {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")}
            )
        except (KeyError, ValidationError) as exc:
            self._fail(name, f"invalid spec: {exc}")
            return
        agent = self._agents.get(session.spec.agent_ref)
        if agent is None:
            self._fail(name, f"Agent {session.spec.agent_ref!r} is not in the files given to "
                       "`corral run`")  # fmt: skip
            return
        chain = self._chain(body)
        agents = {
            ref: {"spec": a.spec.model_dump(by_alias=True, exclude_none=True, mode="json")}
            for ref, a in self._agents.items()
        }
        lineage = derive_lineage(body, agent.spec, chain, dict(agents))
        if isinstance(lineage, LineageRefusal):
            self._fail(name, f"invalid spec: {lineage.message}")
            return
        if lineage.max_turns < 1:
            self._fail(name, out_of_turns_message(0, lineage.max_turns))
            return
        # Held to its own Agent's branch patterns, as the operator holds a cluster's child.
        protected = session_refusal(session, agent)
        if protected is not None:
            self._fail(name, f"invalid spec: {protected}")
            return
        parent_name = str(chain[0]["metadata"]["name"])
        parent_workspace = self.workspaces[parent_name]
        branch = session.spec.workspace.branch or f"corral/{name}"
        state_dir = self.state_root / name
        workspace = clone_for_child(
            parent_workspace, state_dir / "workspace", session.spec.workspace.ref, branch
        )
        self.workspaces[name] = workspace
        self._view.event(
            {"source": "driver", "type": "created", "session": name, "phase": "Pending",
             "message": f"{session.spec.task.splitlines()[0][:120]} (from {parent_name} at "
                        f"{session.spec.workspace.ref[:12]}, up to {lineage.max_turns} turns)"}
        )  # fmt: skip
        await self._run_child(session, agent, lineage.max_turns, workspace, state_dir)
        final = await LocalTurnStore(state_dir).load()
        self._deliver(name, branch, workspace, parent_workspace, final)

    def _subtree(self, uid: str) -> list[str]:
        """The names of every session below `uid`."""
        names: list[str] = []
        for kid in self.files.children_of(uid):
            names.append(str(kid["metadata"]["name"]))
            names += self._subtree(str(kid["metadata"]["uid"]))
        return names

    def _deliver(
        self, name: str, branch: str, workspace: Path, parent_workspace: Path, final: DriverState
    ) -> None:
        """The child's branch (and its own children's) into the parent's repository, published
        with the child's end in one write: `status.delivery` is what the parent's line names."""
        body = self.files.get(name)
        if body is None:
            return
        status = final.status_patch()
        revision = _git(workspace, "rev-parse", "HEAD")
        branches = [branch]
        for below in self._subtree(str(body["metadata"]["uid"])):
            below_body = self.files.get(below) or {}
            below_branch = ((below_body.get("status") or {}).get("delivery") or {}).get("branch")
            if below_branch:
                branches.append(str(below_branch))
        try:
            fetch_branches(parent_workspace, workspace, branches)
            status["delivery"] = {
                "branch": branch, "revision": revision, "pushedAt": now_rfc3339(),
                "state": "Delivered",
                "message": f"fetched {revision} into the parent's repository as {branch}",
            }  # fmt: skip
        except ChildWorkspaceError as exc:
            status["delivery"] = {"branch": branch, "state": "Failed", "message": str(exc)[:1000]}
        self.files.write_status(name, status)

    # -------------------------------------------------------------------- a parent's wait

    async def until_satisfied(self, uid: str, state: DriverState, stop: Callable[[], bool]) -> None:
        """Return once the parent's wait is satisfied (the operator's rule), or `stop()`."""
        while not stop():
            children = self.files.children_of(uid)
            if wait_satisfied(state.waiting_for, children, state.reported_children):
                return
            await asyncio.sleep(POLL_SECONDS)
