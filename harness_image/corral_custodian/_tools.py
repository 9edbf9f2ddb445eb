"""Carrying out the control tools: load the session's facts, ask a rule, act on its answer.

Every decision is a pure function in `rules`; this module only gathers the inputs (from the
cluster, with the custodian's own narrow identity) and applies the plan. Without a cluster, the
children's tools work on `corral run`'s session tree (`corral_common.session_files`): the same
rules, the same child manifest, written to a file that `corral run` runs (docs/children.md).
"""

from __future__ import annotations

import asyncio
import json
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from corral_api.decisions import APPROVED, PENDING, approval_decision, decision_of_verdict
from corral_api.digest import check_definition_digest
from corral_api.evidence import verdict_for
from corral_api.freeze import FROZEN_ERROR
from corral_api.labels import evidence_selector
from corral_common import toolmatch
from corral_common.approval_files import ApprovalFiles, ApprovalNotFound
from corral_common.session_files import SessionFileError, SessionFiles
from corral_kube import KubeClient, KubeError

from . import rules
from ._delivery import Deliveries, with_remote_head
from ._git import GitPusher
from ._kube import corral_path
from ._live import LiveError, LiveState, Loaded
from ._secrets import redact
from ._usage_store import UsageStore
from .budget import Held, remaining
from .menu import ALL_TOOLS, why_not_offered


@dataclass(frozen=True)
class ToolResult:
    content: str
    is_error: bool = False
    ends_turn: bool = False

    def wire(self) -> dict[str, Any]:
        return {"content": self.content, "isError": self.is_error, "endsTurn": self.ends_turn}


class ToolFailure(Exception):
    """The tool cannot run at all; the message becomes an error result."""


# The conversation a Menu call came for (the route's path): `push` sends its last sent tip.
_CONVERSATION: ContextVar[str] = ContextVar("conversation", default="")

# What a freeze stops among the control tools: whatever starts work or changes the remote.
FROZEN_TOOLS = frozenset({"spawn_child", "push", "land"})


def _error(message: str) -> ToolResult:
    return ToolResult(message, is_error=True)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True)


class ControlTools:
    def __init__(
        self,
        live: LiveState,
        kube: KubeClient | None,
        pusher: GitPusher | None,
        usage: UsageStore,
        local_approvals: ApprovalFiles | None = None,
        deliveries: Deliveries | None = None,
        session_files: SessionFiles | None = None,
    ) -> None:
        self._live = live
        # Without a cluster: `corral run`'s session tree, where children are created and read.
        self._files = session_files if kube is None else None
        # The parent's last delivery: a child starts from that revision (docs/children.md).
        self._deliveries = deliveries
        self._kube = kube
        self._pusher = pusher
        self._usage = usage
        # Without a cluster (`corral run`) the gate's requests go to the one local file store.
        self._local_approvals = local_approvals
        # Spawns are counted against the cluster; one at a time so two calls cannot both pass.
        self._spawn_lock = asyncio.Lock()

    @property
    def namespace(self) -> str:
        return self._live.namespace

    async def load(self) -> Loaded:
        try:
            return await self._live.load(fresh=True, depth=True)
        except LiveError as e:
            raise ToolFailure(str(e)) from e

    async def invoke(
        self,
        name: str,
        tool_input: dict[str, Any],
        submission: str,
        *,
        gate: bool = False,
        conversation: str = "",
    ) -> ToolResult:
        """Run one Menu tool. `gate`: the harness's own approval gate asks (request_approval
        for a call its policy answered `ask`), which the Agent's allowlist does not govern."""
        if name not in ALL_TOOLS:
            raise KeyError(name)
        _CONVERSATION.set(conversation)
        try:
            loaded = await self.load()
            if loaded.frozen_by is not None and name in FROZEN_TOOLS:
                return _error(
                    f"{FROZEN_ERROR}: {name} is refused: the session is "
                    f"{loaded.frozen_by.describe()}"
                )
            if gate and name == "request_approval" and self._kube is None:
                return self._request_local_approval(loaded, tool_input, submission)
            reason = why_not_offered(loaded.facts, name, gate=gate)
            if reason is not None:
                return _error(reason)
            handler = getattr(self, f"_{name}")
            result: ToolResult = await handler(loaded, tool_input, submission)
            return result
        except ToolFailure as e:
            return _error(str(e))
        except KubeError as e:
            return _error(f"{name} failed: {e}")

    # ------------------------------------------------------------------------------ children

    async def _children(self, loaded: Loaded) -> list[dict[str, Any]]:
        if self._files is not None:
            listed = self._files.children_of(loaded.facts.uid)
        else:
            assert self._kube is not None
            listed = await self._kube.list(
                corral_path(self.namespace, "sessions"),
                label_selector=f"corral.dev/parent-uid={loaded.facts.uid}",
            )
        return [c for c in listed if rules.is_own_child(loaded.facts, c)]

    async def _create_session(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self._files is not None:
            try:
                return self._files.create(manifest)
            except (OSError, SessionFileError) as e:
                raise ToolFailure(f"spawn_child failed: {e}") from e
        assert self._kube is not None
        path = corral_path(self.namespace, "sessions")
        return dict(await self._kube.request("POST", path, body=manifest))

    async def _get_session(self, name: str) -> dict[str, Any] | None:
        if self._files is not None:
            return self._files.get(name)
        assert self._kube is not None
        return await self._kube.get(corral_path(self.namespace, "sessions", name))

    async def _all_sessions(self) -> list[dict[str, Any]]:
        if self._files is not None:
            return self._files.every()
        assert self._kube is not None
        return await self._kube.list(corral_path(self.namespace, "sessions"))

    async def _spawn_child(
        self, loaded: Loaded, tool_input: dict[str, Any], submission: str
    ) -> ToolResult:
        async with self._spawn_lock:
            children = await self._children(loaded)
            this_turn = sum(
                1
                for c in children
                if (c["metadata"].get("annotations") or {}).get("corral.dev/parent-turn")
                == loaded.turn_key
            )
            left = remaining(
                loaded.facts.budget, self._usage.totals, self._usage.reserved, self._usage.carved
            )
            plan = rules.decide_spawn(loaded.facts, tool_input, this_turn, left)
            if isinstance(plan, rules.Refusal):
                return _error(plan.reason)
            manifest = rules.child_session_manifest(
                loaded.facts, plan, loaded.session.get("spec") or {}, loaded.turn_key
            )
            start = self._start_revision()
            if start is not None:
                # The parent's working copy as it stands: the harness delivered it just before
                # this call, so the child checks out exactly what the parent has now.
                manifest["spec"].setdefault("workspace", {})["ref"] = start
            if submission:
                manifest["metadata"]["annotations"]["corral.dev/parent-submission"] = submission
            # Carved before the create, so a model request in between cannot spend it too.
            carved = plan.budget.carved
            self._usage.carve(carved, str(manifest["metadata"]["generateName"]))
            try:
                created = await self._create_session(manifest)
            except BaseException:
                self._usage.carve(Held() - carved, "(child not created)")
                raise
        answer: dict[str, Any] = {
            "child": created["metadata"]["name"],
            "agent": plan.agent_ref,
            "depth": plan.depth,
            "maxTurns": plan.max_turns,
            "readOnly": plan.read_only,
            "ref": (manifest["spec"].get("workspace") or {}).get("ref"),
        }
        if plan.budget.wire():
            answer["budget"] = plan.budget.wire()
        if plan.ignored:
            answer["ignored"] = list(plan.ignored)
        return ToolResult(_json(answer))

    def _start_revision(self) -> str | None:
        """The revision a child starts from: the parent's last push, when its last delivery
        went through (else the child starts from the parent's own spec.workspace.ref)."""
        record = self._deliveries.record if self._deliveries is not None else None
        if record is None:
            return None
        if record.noRemote and self._files is not None:
            # `corral run` (no remote to push to): the parent's commit in its own repository,
            # which the child's clone is made from. (A cluster's child could not fetch it.)
            return record.attempted
        if record.state == "Failed":
            return None
        return record.revision

    async def _child_status(self, loaded: Loaded, tool_input: dict[str, Any], _: str) -> ToolResult:
        name = tool_input.get("name")
        if not rules.is_object_name(name):
            return _error("'name' must name a child session")
        assert isinstance(name, str)
        child = await self._get_session(name)
        if child is None or not rules.is_own_child(loaded.facts, child):
            return _error(f"this session has no child named {name!r}")
        status = child.get("status") or {}
        return ToolResult(
            _json(
                {
                    "name": name,
                    "phase": status.get("phase", "Pending"),
                    "turns": status.get("turns", 0),
                    "message": status.get("message"),
                    "lastSettlement": status.get("lastSettlement"),
                    "usage": status.get("usage"),
                }
            )
        )

    async def _walk_tree(self, loaded: Loaded, _input: dict[str, Any], _: str) -> ToolResult:
        sessions = await self._all_sessions()
        return ToolResult(
            "\n".join(rules.tree_lines(loaded.facts.uid, loaded.facts.name, sessions))
        )

    async def _wait_children(
        self, loaded: Loaded, tool_input: dict[str, Any], _: str
    ) -> ToolResult:
        verdict = rules.decide_wait(tool_input, await self._children(loaded))
        if isinstance(verdict, rules.Refusal):
            return _error(verdict.reason)
        body = _json({"summary": verdict.summary, "children": verdict.children})
        if verdict.satisfied:
            return ToolResult(body)
        # Not yet: the turn ends here and the session waits for its children.
        return ToolResult("still waiting for children; " + body, ends_turn=True)

    # ----------------------------------------------------------------------------- approvals

    async def _create_approval(self, loaded: Loaded, ask: rules.AskApproval) -> str:
        assert self._kube is not None
        # One Approval per action: a pending request for the same call is reused.
        mine = await self._kube.list(
            corral_path(self.namespace, "approvals"),
            label_selector=f"corral.dev/session={loaded.facts.name[:63]}",
        )
        existing = rules.pending_binding(mine, loaded.facts, ask)
        if existing is not None:
            return str(existing["metadata"]["name"])
        created = await self._kube.request(
            "POST",
            corral_path(self.namespace, "approvals"),
            body=rules.approval_manifest(loaded.facts, ask),
        )
        return str(created["metadata"]["name"])

    async def _request_approval(
        self, loaded: Loaded, tool_input: dict[str, Any], _: str
    ) -> ToolResult:
        ask = rules.approval_request(tool_input)
        if isinstance(ask, rules.Refusal):
            return _error(ask.reason)
        # The action as the tool that acts will look for it (`land` checks its own Approval).
        action = rules.gate_action(ask, loaded.facts)
        if isinstance(action, rules.Refusal):
            return _error(action.reason)
        name = await self._create_approval(loaded, action)
        return ToolResult(
            _json({"approval": name, "digest": action.digest, "decision": PENDING}),
            ends_turn=True,
        )

    def _request_local_approval(
        self, loaded: Loaded, tool_input: dict[str, Any], submission: str
    ) -> ToolResult:
        """The gate's request where no cluster holds Approvals: the local file store."""
        if self._local_approvals is None:
            return _error("request_approval needs the cluster or a state directory; neither is set")
        ask = rules.approval_request(tool_input)
        if isinstance(ask, rules.Refusal):
            return _error(ask.reason)
        refused = toolmatch.forbidden_reason(toolmatch.menu_name("request_approval"))
        if refused is not None:
            return _error(refused)
        action = rules.gate_action(ask, loaded.facts)
        if isinstance(action, rules.Refusal):
            return _error(action.reason)
        record = self._local_approvals.create(
            scope=loaded.facts.name,
            tool=action.tool,
            arguments=action.arguments,
            reason=action.reason,
            submission_id=submission,
        )
        return ToolResult(
            _json({"approval": record["id"], "digest": record["digest"], "decision": PENDING}),
            ends_turn=True,
        )

    async def approval_decision(self, name: str) -> dict[str, Any] | None:
        """An Approval's decision, only when it belongs to this session (else None).

        `ready` says whether the call may replay now: an approved landing with a landing check
        configured waits, beside the human, for the Evidence verdict at its revision (any final
        verdict: a Fail is then refused by `land` itself, with the reason)."""
        if self._kube is None:
            return await self._local_decision(name)
        if not rules.is_object_name(name):
            return None
        try:
            loaded = await self._live.load()  # polled every second: the cache is enough here
        except LiveError as e:
            raise ToolFailure(str(e)) from e
        approval = await self._kube.get(corral_path(self.namespace, "approvals", name))
        if approval is None or not rules.own_approval(approval, loaded.facts):
            return None
        decision = approval_decision(approval)
        answer: dict[str, Any] = {"approval": name, "decision": decision, "ready": True}
        action = (approval.get("spec") or {}).get("action") or {}
        check = loaded.facts.land_check
        if decision == APPROVED and action.get("tool") == "land" and check is not None:
            try:
                revision = str(json.loads(str(action.get("arguments")))["revision"])
            except (ValueError, KeyError, TypeError):
                return answer  # land itself refuses such arguments
            verdict = await self._land_verdict(loaded, check, revision)
            answer["evidence"] = {"check": check.name, "revision": revision, "verdict": verdict}
            answer["ready"] = verdict not in ("Missing", "Pending")
        return answer

    async def _local_decision(self, name: str) -> dict[str, Any] | None:
        if self._local_approvals is None:
            return None
        try:
            loaded = await self._live.load()
        except LiveError as e:
            raise ToolFailure(str(e)) from e
        try:
            verdict = self._local_approvals.decision(name, scope=loaded.facts.name)
        except ApprovalNotFound:
            return None
        return {"approval": name, "decision": decision_of_verdict(verdict), "ready": True}

    async def _land_verdict(self, loaded: Loaded, check: Any, revision: str) -> str:
        """The verdict that counts for the landing check at `revision` (corral_api.evidence)."""
        assert self._kube is not None
        if not loaded.facts.repo:
            return "Missing"
        evidences = await self._kube.list(
            corral_path(self.namespace, "evidences"),
            label_selector=evidence_selector(check.name, revision, loaded.facts.repo),
        )
        digest = check_definition_digest(check.command, check.image)
        return verdict_for(
            evidences, check.name, revision, loaded.facts.repo, digest, loaded.facts.namespace
        )

    # ---------------------------------------------------------------------------- push, land

    async def _push(self, loaded: Loaded, tool_input: dict[str, Any], _: str) -> ToolResult:
        plan = rules.decide_push(await with_remote_head(loaded.facts, self._pusher), tool_input)
        if isinstance(plan, rules.Refusal):
            return _error(plan.reason)
        if self._pusher is None:
            return _error("push is not configured: the custodian has no mirror")
        refused = self._pusher.remote_refusal()
        if refused is not None:
            return _error(f"git push to {plan.branch} refused: {redact(refused)}")
        # The harness sends the workspace's commits as a bundle just before it calls push.
        revision = await self._pusher.sent(_CONVERSATION.get())
        if revision is None:
            return _error(
                f"git push to {plan.branch} failed: revision_not_sent: no commits were sent"
            )
        result = await self._pusher.push_to(revision, plan.branch)
        if not result.ok:
            return _error(f"git push to {plan.branch} failed: {result.message}")
        return ToolResult(f"pushed {revision} to {plan.branch}")

    async def _land(self, loaded: Loaded, tool_input: dict[str, Any], _: str) -> ToolResult:
        assert self._kube is not None
        approvals = await self._kube.list(corral_path(self.namespace, "approvals"))
        evidences: list[dict[str, Any]] = []
        check = loaded.facts.land_check
        args = rules.land_arguments(tool_input)
        if check is not None and loaded.facts.repo and not isinstance(args, rules.Refusal):
            evidences = await self._kube.list(
                corral_path(self.namespace, "evidences"),
                label_selector=evidence_selector(check.name, args["revision"], loaded.facts.repo),
            )
        decision = rules.decide_land(loaded.facts, tool_input, approvals, evidences)
        if isinstance(decision, rules.Refusal):
            return _error(decision.reason)
        if isinstance(decision, rules.AskApproval):
            name = await self._create_approval(loaded, decision)
            note = "a human must approve; call land again with the same input"
            if check is not None:
                note += f" (the check {check.name!r} must also Pass at this revision)"
            return ToolResult(
                _json({"approval": name, "digest": decision.digest, "decision": PENDING,
                       "note": note}),
                ends_turn=True,
            )  # fmt: skip
        if self._pusher is None:
            return _error("land is not configured: the custodian has no mirror")
        # Only a revision the harness sent (a bundle into the mirror) can land.
        if not await self._pusher.has_commit(decision.revision):
            return _error(
                f"landing on {decision.target} failed: revision_not_sent: "
                f"{decision.revision} was not sent to the custodian"
            )
        result = await self._pusher.push_to(decision.revision, decision.target)
        if not result.ok:
            return _error(f"landing on {decision.target} failed: {result.message}")
        return ToolResult(f"landed {decision.revision} on {decision.target}")
