"""`corral console --state DIR`: the console over `corral run` state directories.

Each run's directory (state.json, ledger.jsonl, transcript.jsonl, custodian/approvals/) is
shown as a Session of the namespace `local`; its pending approvals (the local file store,
`corral_common.approval_files`) as Approvals a person at this machine decides. The pages, the
live turn and the decisions are the cluster console's own (operator/corral_operator/console):
only the source differs. The transcript file is followed as the wire is, and a finished run's
receipts are read from it as an archive's are (`receipts_of`, docs/history.md).

DIR is a run's state directory, or a directory of runs (`corral run`'s state home, whose runs
are under `runs/`, or any directory whose subdirectories are runs).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corral_api.decisions import APPROVED, decision_of_verdict
from corral_api.timestamps import rfc3339
from corral_common.approval_files import (
    ApprovalFiles,
    ApprovalNotFound,
    ApprovalScopeMismatch,
    Verdict,
)
from corral_operator.archive.record import ArchivedSession, receipts_of
from corral_operator.console.access import Person, Refused
from corral_operator.console.changes import GIT_SECONDS, ChangesUnavailable, git_env, read_changes
from corral_operator.console.pages import RUN_DIR_ANNOTATION
from corral_operator.console.reader import StreamUnavailable

from ._localstore import LEDGER_FILE, STATE_FILE, TRANSCRIPT_FILE, read_jsonl
from ._workspace import RECORD as CHECKOUT_FILE

Obj = dict[str, Any]
NAMESPACE = "local"
POLL_SECONDS = 0.2
APPROVALS = Path("custodian") / "approvals"
SESSIONS = "sessions"  # the run's session tree: <name>.json each (cli/corral_cli/_children.py)


def _stamp(seconds: float) -> str:
    return rfc3339(datetime.fromtimestamp(seconds, UTC))


def _is_run(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in (STATE_FILE, TRANSCRIPT_FILE))


def _run_dirs(root: Path) -> list[Path]:
    if _is_run(root):
        return [root]
    parent = root / "runs" if (root / "runs").is_dir() else root
    if not parent.is_dir():
        return []
    return [p for p in sorted(parent.iterdir()) if _is_run(p)]


def _read_json(path: Path) -> Obj:
    try:
        found = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):  # not written yet, or being rewritten
        return {}
    return found if isinstance(found, dict) else {}


def _state(run: Path) -> Obj:
    return _read_json(run / STATE_FILE)


def _record(run: Path) -> Obj:
    """The run's own Session as `corral run` recorded it (sessions/<name>.json: the root, the one
    without a parent), or {} for a run that got no further than its state."""
    roots = []
    for path in sorted((run / SESSIONS).glob("*.json")):
        found = _read_json(path)
        if found.get("metadata", {}).get("name") and not found.get("spec", {}).get("parentRef"):
            roots.append(found)
    return roots[0] if roots else {}


def _started(run: Path) -> float:
    stamp = _state(run).get("startedAt")
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return run.stat().st_mtime


def find_runs(root: Path) -> dict[str, Path]:
    """The runs under `root` by the name each is shown as: its Session's `metadata.name`. Runs
    of one Session (each run of a file has its own directory): the latest has the name, the
    others their directory's name; a run without a recorded Session, its directory's name."""
    dirs = _run_dirs(root)
    named = {run: str(_record(run).get("metadata", {}).get("name") or "") for run in dirs}
    found: dict[str, Path] = {}
    for run in sorted(dirs, key=_started, reverse=True):
        name = named[run]
        if not name or name in found:
            name = run.name
        while name in found:  # a directory named as another run's Session
            name = f"{name}-{len(found)}"
        found[name] = run
    return dict(sorted(found.items()))


def _events(run: Path) -> list[Obj]:
    """The run's wire events once each, in offset order (a re-attached run records some
    events twice)."""
    by_offset: dict[int, Obj] = {}
    for event in read_jsonl(run / TRANSCRIPT_FILE):
        if "offset" in event:
            by_offset.setdefault(int(event["offset"]), event)
    return [by_offset[k] for k in sorted(by_offset)]


def _checkout(run: Path) -> Obj:
    """Where the run's commits went (checkout.json: repository, branch, base), or {} when the
    agent worked in a directory outside git."""
    found = _read_json(run / CHECKOUT_FILE)
    return found if found.get("repository") and found.get("branch") else {}


def _branch_tip(checkout: Obj) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(checkout["repository"]), "rev-parse", "--verify", "-q",
         f"refs/heads/{checkout['branch']}^{{commit}}"],
        capture_output=True, text=True, check=False, timeout=GIT_SECONDS,
        env=git_env(Path(tempfile.gettempdir())),
    )  # fmt: skip
    tip = done.stdout.strip()
    return tip if done.returncode == 0 and tip else None


def _delivery(run: Path) -> Obj | None:
    """What the run committed, as a cluster Session's `status.delivery` says what was pushed:
    the branch and its commit in the person's repository."""
    checkout = _checkout(run)
    if not checkout:
        return None
    try:
        tip = _branch_tip(checkout)
    except (OSError, subprocess.TimeoutExpired):
        tip = None
    where = f"{checkout['branch']} in {checkout['repository']}"
    if tip is None or tip == checkout.get("base"):
        return {"branch": checkout["branch"], "state": "NothingCommitted",
                "message": f"nothing committed on {where}"}  # fmt: skip
    return {"branch": checkout["branch"], "revision": tip, "state": "Committed",
            "message": f"committed {tip} on {where}"}  # fmt: skip


def _session(name: str, run: Path) -> Obj:
    state = _state(run)
    record = _record(run)
    spec = dict(record.get("spec") or {})
    if not spec:  # no record: what the run's files say
        admissions = [r for r in read_jsonl(run / LEDGER_FILE) if r.get("kind") == "admission"]
        agents = sorted(p.name for p in (run / "harness" / "conversations").glob("*"))
        spec = {
            "agentRef": agents[0] if agents else "",
            "task": admissions[0].get("message", "") if admissions else "",
        }
    created = state.get("startedAt") or _stamp(run.stat().st_mtime)
    usage = state.get("usage") or {}
    status = {
        "phase": state.get("phase") or "Pending",
        "turns": state.get("turns") or 0,
        "usage": {
            "inputTokens": usage.get("inputTokens") or 0,
            "outputTokens": usage.get("outputTokens") or 0,
            "cost": usage.get("cost") or 0.0,
        },
        "lastTurn": state.get("lastTurn"),
        "lastSettlement": state.get("lastSettlement"),
        "plan": state.get("plan"),
        "message": state.get("message"),
        "answer": state.get("answer"),
        "finishedAt": state.get("finishedAt"),
        "delivery": _delivery(run),
    }
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": str((record.get("metadata") or {}).get("uid") or run.name),
            "creationTimestamp": created,
            # Which run this is: runs of one Session share its name.
            "annotations": {RUN_DIR_ANNOTATION: str(run)},
        },
        "spec": spec,
        "status": {k: v for k, v in status.items() if v is not None},
    }


def _approval(session: str, record: Obj, mtime: float) -> Obj:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {
            "name": record["id"],
            "namespace": NAMESPACE,
            "creationTimestamp": _stamp(mtime),
        },
        "spec": {
            "sessionRef": {"name": session},
            "action": {"tool": record.get("tool"), "arguments": record.get("input")},
            "reason": record.get("reason"),
        },
        "status": {
            "decision": decision_of_verdict(record.get("decision")),
            "decidedBy": record.get("decidedBy"),
            "comment": record.get("comment"),
        },
    }


class LocalStream:
    """The run's transcript file, read as the wire is (it has the wire's offsets)."""

    def __init__(self, run: Path) -> None:
        self.run = run

    async def aclose(self) -> None:
        """Nothing to close: each page reads the file anew."""


class LocalSource:
    """A console `Source` over state directories: read-only except for approval decisions."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.namespaces: tuple[str, ...] | None = (NAMESPACE,)
        self._changes: dict[tuple[str, str, str], Obj] = {}  # a revision's changes never change

    def _run(self, name: str) -> Path | None:
        return find_runs(self.root).get(name)  # never a path built from the URL

    async def objects(self, kind: str, namespace: str) -> list[Obj]:
        if namespace != NAMESPACE:
            return []
        runs = find_runs(self.root)
        if kind == "Session":
            return [_session(name, run) for name, run in runs.items()]
        if kind == "Approval":
            found = []
            for name, run in runs.items():
                for path in sorted((run / APPROVALS).glob("apr_*.json")):
                    try:
                        record = json.loads(path.read_text("utf-8"))
                    except ValueError:  # being rewritten: the next refresh shows it
                        continue
                    found.append(_approval(name, record, path.stat().st_mtime))
            return found
        return []  # Goals and Evidence need a cluster

    async def list_everywhere(self, kind: str) -> dict[str, list[Obj]]:
        return {NAMESPACE: await self.objects(kind, NAMESPACE)}

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        if kind == "Session":
            run = self._run(name) if namespace == NAMESPACE else None
            return None if run is None else _session(name, run)
        found = await self.objects(kind, namespace)
        return next((o for o in found if o["metadata"]["name"] == name), None)

    async def wire(self, session: Obj) -> LocalStream:
        run = self._run(session["metadata"]["name"])
        if run is None:
            raise StreamUnavailable("the run's state directory is gone")
        return LocalStream(run)

    async def updates(
        self, client: Any, conversation: str, offset: int, wait: float
    ) -> tuple[list[Obj], int]:
        """Events from `offset`, waiting up to `wait` seconds for the run to write one."""
        assert isinstance(client, LocalStream)
        deadline = time.monotonic() + wait
        while True:
            events = [e for e in _events(client.run) if int(e["offset"]) >= offset]
            if events or time.monotonic() >= deadline:
                return events, (int(events[-1]["offset"]) + 1 if events else offset)
            await asyncio.sleep(POLL_SECONDS)

    async def archived(self, namespace: str, name: str, uid: str | None) -> ArchivedSession | None:
        """A run's record as the archive keeps one: its events and a receipt per settlement."""
        run = self._run(name) if namespace == NAMESPACE else None
        if run is None:
            return None
        events = _events(run)
        session = _session(name, run)
        record = {
            "archivedAt": session["status"].get("finishedAt"),
            "cause": "corral run",
            "events": len(events),
            "receipts": receipts_of(events),
            "session": session,
        }
        return ArchivedSession(record, events)

    async def changes(self, session: Obj) -> Obj | None:
        """What the run committed, turn by turn, read from the person's repository (the branch
        `corral run` committed on, from the base it started at: checkout.json)."""
        run = self._run(session["metadata"]["name"])
        checkout = _checkout(run) if run is not None else {}
        delivery = (session.get("status") or {}).get("delivery") or {}
        shown = {"remote": str(checkout.get("repository") or ""), "branch": delivery.get("branch")}
        if not checkout:
            return {**shown, "unavailable": "the run worked in a directory outside git"}
        revision = str(delivery.get("revision") or "")
        if not revision:
            return {**shown, "unavailable": str(delivery.get("message") or "nothing committed")}
        key = (str(checkout["repository"]), str(checkout.get("base") or ""), revision)
        if key not in self._changes:
            try:
                found = await asyncio.to_thread(
                    read_changes, Path(key[0]), git_env(Path(tempfile.gettempdir())),
                    key[1] or None, revision, session["metadata"]["name"],
                )  # fmt: skip
            except ChangesUnavailable as why:
                return {**shown, "revision": revision, "unavailable": str(why)}
            self._changes[key] = found
        return {**shown, **self._changes[key]}


class LocalAccess:
    """The person is whoever runs `corral console` on this machine (loopback only): they may
    read every run and decide its approvals, as at `corral run`'s own prompt."""

    needs_login = False
    suspends = False  # a local run is stopped with Ctrl-C, not parked

    def __init__(self, source: LocalSource) -> None:
        self.source = source
        self.me = Person(name=f"{getpass.getuser()} (local)")

    async def authenticate(self, token: str | None) -> Person:
        return self.me

    async def allowed(
        self, person: Person, verb: str, resource: str, namespace: str, subresource: str = ""
    ) -> bool:
        # Everything here is theirs; a namespace other than `local` holds nothing (404).
        return True

    async def patch_session(
        self, person: Person, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        raise Refused(409, "not_supported", "a local run cannot be suspended or resumed")

    async def decide(
        self, person: Person, namespace: str, name: str, decision: str, comment: str
    ) -> dict[str, Any]:
        for run_name, run in find_runs(self.source.root).items():  # shown names
            files = ApprovalFiles(run / APPROVALS)
            try:
                record = files.read(name)
            except ApprovalNotFound:
                continue
            verdict: Verdict = "approved" if decision == APPROVED else "denied"
            try:
                # Bound to the request's own scope and call, as every local decision is.
                written = files.decide(
                    name, verdict, by=f"{person.name} in corral console",
                    scope=str(record.get("scope")), digest=str(record.get("digest")),
                    comment=comment.strip(),
                )  # fmt: skip
            except ApprovalScopeMismatch as err:
                raise Refused(403, "forbidden", str(err)) from None
            except ValueError as err:
                raise Refused(409, "already_decided", str(err)) from None
            path = files.path(name)
            return _approval(run_name, written, path.stat().st_mtime)
        raise Refused(404, "not_found", f"no approval {name} in {self.source.root}")
