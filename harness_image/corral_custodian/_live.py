"""The custodian's view of its Session and Agent, read live from the cluster.

With a cluster configured, the Session (`CORRAL_SESSION_NAME` in `CORRAL_SESSION_NAMESPACE`,
whose uid must be `CORRAL_SESSION_UID`) and its Agent (`CORRAL_AGENT_NAME`, else the Session's
immutable `spec.agentRef`) are read through the API with the pod's service-account token and
kept for at most `ttl` seconds, so an edited Agent applies from the next call. Without one
(`corral run`), the Agent comes from `CORRAL_AGENT_SPEC_JSON` / `_FILE` and the Session's few
facts from the environment; in a session tree of `corral run` (`CORRAL_LOCAL_SESSIONS_DIR`) the
Session itself (spec, turns, the turn in flight, its place in the tree) is read from its file
there, which `corral run` keeps as the operator keeps a Session's status.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral_api.freeze import FrozenBy, covering_freeze, needs_ancestors
from corral_api.kinds import MAX_DEPTH_CAP, AgentSpec, SessionSpec
from corral_common.session_files import SessionFiles
from corral_kube import KubeClient, KubeError, KubeRefused

from . import rules
from ._kube import corral_path
from .budget import Budget, lowest
from .facts import SessionFacts
from .settings import CustodianSettings, SettingsError


class LiveError(Exception):
    """The custodian cannot establish its own session's facts; nothing may proceed.

    `retryable`: the API server could not be asked (it may answer later); otherwise the
    cluster answered and the answer refuses (no such Session, another uid, a bad spec).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class Loaded:
    facts: SessionFacts
    session: dict[str, Any]  # the Session object; empty without a cluster
    turn_key: str  # identifies the current turn, from the Session status the operator writes
    # The Freeze that holds this session (or an ancestor): model calls, pushes and spawns are
    # refused while it is in force. None without a cluster.
    frozen_by: FrozenBy | None = None


class _Cached:
    def __init__(self) -> None:
        self.value: dict[str, Any] | None = None
        self.at = -1e9
        self.lock = asyncio.Lock()


class LiveState:
    def __init__(
        self, settings: CustodianSettings, kube: KubeClient | None, ttl: float = 1.0
    ) -> None:
        self._settings = settings
        self._kube = kube
        self._ttl = ttl
        self._cache: dict[str, _Cached] = {}
        self._files = (
            SessionFiles(settings.local_sessions_dir)
            if kube is None and settings.local_sessions_dir is not None
            else None
        )

    @property
    def namespace(self) -> str:
        return self._settings.session_namespace

    async def _get(self, path: str, fresh: bool) -> dict[str, Any] | None:
        """GET through the cache: at most one read per path per `ttl` seconds, unless fresh."""
        assert self._kube is not None
        entry = self._cache.setdefault(path, _Cached())
        async with entry.lock:
            if not fresh and time.monotonic() - entry.at < self._ttl:
                return entry.value
            value = await self._kube.get(path)
            entry.value, entry.at = value, time.monotonic()
            return value

    async def load(self, *, fresh: bool = False, depth: bool = False) -> Loaded:
        """This session's facts. `fresh` skips the cache (control tools count turns and
        children, so they read the Session as it is now); `depth` walks the parent chain."""
        try:
            return await self._load(fresh, depth)
        except KubeError as e:
            raise LiveError(
                f"the custodian cannot read its session from the cluster: {e}",
                # Unreachable, or the token unreadable for now: as a 5xx, worth a retry.
                retryable=not isinstance(e, KubeRefused) or e.status >= 500 or e.status == 429,
            ) from e
        except SettingsError as e:
            raise LiveError(str(e)) from e

    async def _load(self, fresh: bool, with_depth: bool) -> Loaded:
        s = self._settings
        if self._kube is None and self._files is not None:
            return self._load_local(self._files)
        if self._kube is None:
            agent = s.load_agent()
            facts = SessionFacts(
                name=s.session_name,
                namespace=s.session_namespace,
                uid=s.session_uid,
                agent=agent,
                read_only=s.read_only,
                branch=s.session_branch,
                cluster=False,
                land_check=agent.landing.check,
                model_override=s.model_override,
                session_budget=s.budget,
            )
            return Loaded(facts, {}, "local")

        session = await self._get(corral_path(self.namespace, "sessions", s.session_name), fresh)
        if session is None:
            raise LiveError(f"session {s.session_name} no longer exists in the cluster")
        uid = (session.get("metadata") or {}).get("uid")
        if uid != s.session_uid:
            raise LiveError(
                f"session {s.session_name} in the cluster has uid {uid}, not this pod's "
                f"{s.session_uid}: it is not this session, and nothing is done for it"
            )
        try:
            spec = SessionSpec.model_validate(session.get("spec") or {})
        except ValidationError as e:
            raise LiveError(
                f"session {s.session_name} has a spec this custodian cannot read: {e}"
            ) from e
        agent_name = s.agent_name or spec.agent_ref
        agent_obj = await self._get(corral_path(self.namespace, "agents", agent_name), fresh)
        if agent_obj is None:
            raise LiveError(f"Agent {agent_name} does not exist in namespace {self.namespace}")
        try:
            agent = AgentSpec.model_validate(agent_obj.get("spec") or {})
        except ValidationError as e:
            raise LiveError(f"Agent {agent_name} has a spec this custodian cannot read: {e}") from e

        status = session.get("status") or {}
        turns = int(status.get("turns") or 0)
        ledger = status.get("ledger") or {}
        session_budget = s.budget
        if spec.budget is not None:
            session_budget = lowest(
                session_budget, Budget(tokens=spec.budget.tokens, cost=spec.budget.cost_usd)
            )
        landing = spec.landing.check if spec.landing and spec.landing.check else None
        facts = SessionFacts(
            name=s.session_name,
            namespace=s.session_namespace,
            uid=s.session_uid,
            agent=agent,
            agent_ref=agent_name,
            depth=await self._depth(session.get("spec") or {}) if with_depth else 0,
            turns_used=turns,
            read_only=spec.read_only or s.read_only,
            branch=s.session_branch,
            ref=spec.workspace.ref,
            cluster=True,
            land_check=landing or agent.landing.check,
            repo=spec.workspace.repo,
            model_override=spec.overrides.model if spec.overrides else None,
            session_budget=session_budget,
        )
        frozen_by = await self._frozen_by(session, fresh)
        turn_key = str(ledger.get("submissionId") or f"turn-{turns}")
        return Loaded(facts, session, turn_key, frozen_by)

    def _load_local(self, files: SessionFiles) -> Loaded:
        """The facts in `corral run`'s session tree: the Agent from the environment (its turn
        cap already lowered by `corral run` as the operator lowers it), the rest from the
        Session's file, checked against this custodian's uid like a cluster's."""
        s = self._settings
        agent = s.load_agent()
        session = files.get(s.session_name)
        if session is None:
            raise LiveError(f"session {s.session_name} is not in {files.directory}")
        uid = (session.get("metadata") or {}).get("uid")
        if uid != s.session_uid:
            raise LiveError(
                f"session {s.session_name} in {files.directory} has uid {uid}, not this "
                f"custodian's {s.session_uid}: nothing is done for it"
            )
        status = session.get("status") or {}
        turns = int(status.get("turns") or 0)
        ledger = status.get("ledger") or {}
        depth = 0
        ref = (session.get("spec") or {}).get("parentRef")
        while ref and depth <= MAX_DEPTH_CAP:
            depth += 1
            parent = files.get(str(ref.get("name", "")))
            if parent is None or parent["metadata"].get("uid") != ref.get("uid"):
                break
            ref = (parent.get("spec") or {}).get("parentRef")
        facts = SessionFacts(
            name=s.session_name,
            namespace=s.session_namespace,
            uid=s.session_uid,
            agent=agent,
            agent_ref=str((session.get("spec") or {}).get("agentRef") or s.agent_name or ""),
            depth=depth,
            turns_used=turns,
            read_only=s.read_only,
            branch=s.session_branch,
            ref=((session.get("spec") or {}).get("workspace") or {}).get("ref"),
            cluster=False,
            local_tree=True,
            land_check=agent.landing.check,
            model_override=s.model_override,
            session_budget=s.budget,
        )
        return Loaded(facts, session, str(ledger.get("submissionId") or f"turn-{turns}"))

    async def _frozen_by(self, session: dict[str, Any], fresh: bool) -> FrozenBy | None:
        """The Freeze in force over this session, read like everything else here: live, for at
        most `ttl` seconds from the cache. The chain up parentRef is walked only when a Freeze
        names a session or an agent (only then can an ancestor matter); an unreadable list is
        an error, never "not frozen"."""
        listed = await self._get(corral_path(self.namespace, "freezes"), fresh)
        freezes = list((listed or {}).get("items") or [])
        chain = [session]
        if needs_ancestors(freezes, self.namespace):
            chain += await self._ancestors(session.get("spec") or {})
        return covering_freeze(chain, freezes)

    async def _ancestors(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        """The Sessions up the parentRef chain, nearest first. A reference without a uid still
        counts here (a freeze errs on the side of holding); one naming another uid does not."""
        found: list[dict[str, Any]] = []
        ref = spec.get("parentRef")
        while ref and len(found) <= MAX_DEPTH_CAP and rules.is_object_name(ref.get("name")):
            parent = await self._get(corral_path(self.namespace, "sessions", ref["name"]), False)
            if parent is None or ref.get("uid") not in (None, parent["metadata"].get("uid")):
                break
            found.append(parent)
            ref = (parent.get("spec") or {}).get("parentRef")
        return found

    async def _depth(self, spec: dict[str, Any]) -> int:
        """Depth by walking parentRef up the tree; the custodian never trusts a depth label."""
        assert self._kube is not None
        depth = 0
        ref = spec.get("parentRef")
        while ref and depth <= MAX_DEPTH_CAP:
            depth += 1
            if not rules.is_object_name(ref.get("name")):
                break
            parent = await self._get(corral_path(self.namespace, "sessions", ref["name"]), False)
            if parent is None or parent["metadata"].get("uid") != ref.get("uid"):
                break
            ref = (parent.get("spec") or {}).get("parentRef")
        return depth
