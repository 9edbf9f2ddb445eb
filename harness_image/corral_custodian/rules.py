"""The custodian's rules as pure functions: each takes what the caller asked and what the
custodian knows, and answers a plan to carry out or a refusal with a reason.

The caller is the model (through the harness) or the agent's own shell, so nothing in a tool's
input is trusted: caps are computed here from the Agent spec and the hard limits, and any
cap-like field in the input is ignored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from corral_api.decisions import PENDING, approval_decision
from corral_api.digest import check_definition_digest
from corral_api.evidence import verdict_for
from corral_api.kinds import FINAL_PHASES, LandingCheck
from corral_common.branches import landing_target_refusal, session_branch_refusal

from ._digest import action_digest, canonical_json
from .budget import Held, Remaining
from .facts import SessionFacts

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def is_object_name(value: object) -> bool:
    """A Kubernetes object name (DNS subdomain); anything else never reaches a URL path."""
    return isinstance(value, str) and bool(OBJECT_NAME.match(value)) and ".." not in value


MAX_TASK_CHARS = 262_144


@dataclass(frozen=True)
class Refusal:
    """The rule said no; `reason` is shown to the model as an error result."""

    reason: str


# ----------------------------------------------------------------------------------- children


@dataclass(frozen=True)
class ChildBudget:
    """The child's spec.budget; None on an axis: no cap there."""

    tokens: int | None = None
    cost: float | None = None

    @property
    def carved(self) -> Held:
        """What the parent gives away: it counts against the parent from now on."""
        return Held(self.tokens or 0, self.cost or 0.0)

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.cost is not None:
            out["costUSD"] = self.cost
        return out


@dataclass(frozen=True)
class ChildPlan:
    task: str
    agent_ref: str
    depth: int
    max_turns: int
    read_only: bool
    criteria: str | None = None
    ignored: tuple[str, ...] = ()  # input fields the custodian would not take from a model
    budget: ChildBudget = field(default_factory=ChildBudget)


_SPAWN_FIELDS = {"task", "agent", "maxTurns", "readOnly", "criteria", "budget"}
MAX_BUDGET_TOKENS = 10_000_000_000
MAX_BUDGET_COST = 1_000_000.0


def _floor_cost(value: float) -> float:
    """Whole micro-dollars, rounded down, so a carve never exceeds what remains."""
    return math.floor(value * 1_000_000) / 1_000_000


def decide_child_budget(asked: Any, remaining: Remaining) -> ChildBudget | Refusal:
    """The child's budget, carved from what this session has left.

    On an axis this session caps, the child gets min(asked, remaining); asked for nothing, it
    gets half of what remains, so the parent keeps enough to read its children's answers.
    On an axis this session does not cap, the child gets what it asked for, or no cap.
    """
    if asked is None:
        asked = {}
    if not isinstance(asked, dict) or set(asked) - {"tokens", "costUSD"}:
        return Refusal("'budget' must be an object with 'tokens' and/or 'costUSD'")
    tokens = asked.get("tokens")
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
    ):
        return Refusal("'budget.tokens' must be a positive integer")
    cost = asked.get("costUSD")
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, int | float) or not cost > 0
    ):
        return Refusal("'budget.costUSD' must be a positive number")
    child_tokens: int | None = min(tokens, MAX_BUDGET_TOKENS) if tokens is not None else None
    if remaining.tokens is not None:
        if remaining.tokens < 1:
            return Refusal("this session has no token budget left to give a child")
        child_tokens = min(tokens, remaining.tokens) if tokens else max(1, remaining.tokens // 2)
    child_cost: float | None = min(float(cost), MAX_BUDGET_COST) if cost is not None else None
    if remaining.cost is not None:
        share = min(float(cost), remaining.cost) if cost else remaining.cost / 2
        child_cost = _floor_cost(share)
        if child_cost <= 0:
            return Refusal("this session has no cost budget left to give a child")
    return ChildBudget(tokens=child_tokens, cost=child_cost)


def decide_spawn(
    facts: SessionFacts,
    tool_input: dict[str, Any],
    children_this_turn: int,
    budget_left: Remaining | None = None,
) -> ChildPlan | Refusal:
    """May this session start one more child now, under which Agent, with what limits?"""
    if not facts.agent.orchestrator:
        return Refusal("only an orchestrator agent may start child sessions")
    child_depth = facts.depth + 1
    if child_depth > facts.max_depth:
        return Refusal(
            f"a child would be at depth {child_depth}, beyond this tree's limit of "
            f"{facts.max_depth}"
        )
    cap = facts.max_children_per_turn
    if children_this_turn >= cap:
        return Refusal(f"this turn has already started {children_this_turn} of {cap} children")
    remaining = facts.remaining_turns
    if remaining < 1:
        return Refusal("this session has no turns left to give a child")

    task = tool_input.get("task")
    if not isinstance(task, str) or not task.strip():
        return Refusal("'task' must be a non-empty string")
    if len(task) > MAX_TASK_CHARS:
        return Refusal(f"'task' is longer than {MAX_TASK_CHARS} characters")

    agent_ref = tool_input.get("agent", facts.agent_ref)
    if not isinstance(agent_ref, str) or not DNS_LABEL.match(agent_ref):
        return Refusal("'agent' must name an Agent in this namespace (a DNS label)")
    # A child runs under its parent's Agent unless that Agent names others it may use.
    others = facts.agent.children.agents
    if agent_ref != facts.agent_ref and agent_ref not in others:
        listed = ", ".join(others) if others else "none"
        return Refusal(
            f"a child may run under Agent {agent_ref!r} only when this session's Agent lists it "
            f"in spec.children.agents (listed: {listed}); leave 'agent' out to use "
            f"{facts.agent_ref!r}"
        )

    asked = tool_input.get("maxTurns", remaining)
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        return Refusal("'maxTurns' must be a positive integer")

    read_only = tool_input.get("readOnly", False)
    if not isinstance(read_only, bool):
        return Refusal("'readOnly' must be true or false")

    criteria = tool_input.get("criteria")
    if criteria is not None and (not isinstance(criteria, str) or not criteria):
        return Refusal("'criteria' must be a non-empty string the child's answer must contain")

    budget = decide_child_budget(
        tool_input.get("budget"), budget_left or Remaining(tokens=None, cost=None)
    )
    if isinstance(budget, Refusal):
        return budget

    return ChildPlan(
        task=task,
        agent_ref=agent_ref,
        depth=child_depth,
        budget=budget,
        # A child never gets more turns than its parent has left.
        max_turns=min(asked, remaining),
        # A read-only parent cannot hand out write access.
        read_only=read_only or facts.read_only,
        criteria=criteria,
        ignored=tuple(sorted(set(tool_input) - _SPAWN_FIELDS)),
    )


def is_own_child(facts: SessionFacts, session: dict[str, Any]) -> bool:
    """A Session is this session's child only when its parentRef names our uid."""
    ref = (session.get("spec") or {}).get("parentRef") or {}
    meta = session.get("metadata") or {}
    return ref.get("uid") == facts.uid and meta.get("namespace", facts.namespace) == (
        facts.namespace
    )


def child_session_manifest(
    facts: SessionFacts, plan: ChildPlan, parent_spec: dict[str, Any], turn_key: str
) -> dict[str, Any]:
    """The child Session: owned by its parent, one level deeper, with the parent's workspace."""
    workspace = parent_spec.get("workspace") or {}
    spec: dict[str, Any] = {
        "agentRef": plan.agent_ref,
        "task": plan.task,
        "workspace": {
            key: workspace[key] for key in ("repo", "ref", "grantedRoot") if key in workspace
        },
        "readOnly": plan.read_only,
        "parentRef": {"name": facts.name, "uid": facts.uid},
    }
    # A child inherits its parent's thinking level and loop choice, as the parent runs them
    # (its override, else its Agent's); a forced plan (spec.plan) is not inherited.
    overrides = parent_spec.get("overrides") or {}
    spec["overrides"] = {
        "thinkingLevel": overrides.get("thinkingLevel") or facts.agent.thinking_level,
        "loop": overrides.get("loop") or facts.agent.loop,
    }
    if plan.budget.wire():
        spec["budget"] = plan.budget.wire()
    if plan.criteria is not None:
        spec["evaluation"] = {
            "criteria": {"substring": plan.criteria},
            "turnBudget": min(plan.max_turns, 100),
        }
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {
            "generateName": f"{facts.name[:40]}-child-",
            "namespace": facts.namespace,
            "labels": {
                "corral.dev/parent": facts.name[:63],
                "corral.dev/parent-uid": facts.uid,
                "corral.dev/depth": str(plan.depth),
            },
            "annotations": {
                "corral.dev/max-turns": str(plan.max_turns),
                "corral.dev/parent-turn": turn_key,
            },
            "ownerReferences": [
                {
                    "apiVersion": "corral.dev/v1alpha1",
                    "kind": "Session",
                    "name": facts.name,
                    "uid": facts.uid,
                }
            ],
        },
        "spec": spec,
    }




@dataclass(frozen=True)
class WaitVerdict:
    satisfied: bool
    summary: str
    children: list[dict[str, str]] = field(default_factory=list)


def decide_wait(
    tool_input: dict[str, Any], children: list[dict[str, Any]]
) -> WaitVerdict | Refusal:
    """Are the children this parent waits for done enough, by the mode it asked for?

    all: every child finished. first: any finished. quorum: at least `quorum` succeeded (or
    can no longer reach it). supervise: all finished, or any failed, so the parent can step in.
    """
    mode = tool_input.get("mode", "all")
    if mode not in ("all", "first", "quorum", "supervise"):
        return Refusal("'mode' must be one of all, first, quorum, supervise")
    names = tool_input.get("children")
    if names is not None and (
        not isinstance(names, list) or not all(isinstance(n, str) for n in names)
    ):
        return Refusal("'children' must be a list of child session names")
    rows = [
        {
            "name": str((c.get("metadata") or {}).get("name", "")),
            "phase": str((c.get("status") or {}).get("phase", "Pending")),
        }
        for c in children
    ]
    if names is not None:
        known = {r["name"] for r in rows}
        unknown = [n for n in names if n not in known]
        if unknown:
            return Refusal(f"not children of this session: {', '.join(unknown)}")
        rows = [r for r in rows if r["name"] in names]
    if not rows:
        return Refusal("this session has no children to wait for")
    finished = [r for r in rows if r["phase"] in FINAL_PHASES]
    succeeded = [r for r in rows if r["phase"] == "Succeeded"]
    failed = [r for r in rows if r["phase"] in ("Failed", "Stopped")]
    if mode == "all":
        satisfied = len(finished) == len(rows)
    elif mode == "first":
        satisfied = bool(finished)
    elif mode == "quorum":
        quorum = tool_input.get("quorum", len(rows) // 2 + 1)
        if isinstance(quorum, bool) or not isinstance(quorum, int) or not 1 <= quorum <= len(rows):
            return Refusal(f"'quorum' must be an integer from 1 to {len(rows)}")
        unreachable = len(rows) - len(failed) < quorum
        satisfied = len(succeeded) >= quorum or unreachable
    else:
        satisfied = bool(failed) or len(finished) == len(rows)
    summary = (
        f"{mode}: {len(finished)}/{len(rows)} finished, {len(succeeded)} succeeded, "
        f"{len(failed)} failed"
    )
    return WaitVerdict(satisfied=satisfied, summary=summary, children=rows)


def tree_lines(root_uid: str, root_name: str, sessions: list[dict[str, Any]]) -> list[str]:
    """The session tree under one session, one indented line per descendant."""
    by_parent: dict[str, list[dict[str, Any]]] = {}
    for s in sessions:
        parent_uid = ((s.get("spec") or {}).get("parentRef") or {}).get("uid")
        if parent_uid:
            by_parent.setdefault(parent_uid, []).append(s)
    lines = [f"{root_name} (this session)"]
    seen = {root_uid}

    def walk(uid: str, indent: int) -> None:
        kids = sorted(by_parent.get(uid, []), key=lambda s: str(s["metadata"].get("name")))
        for kid in kids:
            kid_uid = str(kid["metadata"].get("uid", ""))
            if kid_uid in seen:  # a cycle cannot come from the custodian; do not loop on one
                continue
            seen.add(kid_uid)
            phase = (kid.get("status") or {}).get("phase", "Pending")
            turns = (kid.get("status") or {}).get("turns", 0)
            lines.append(f"{'  ' * indent}- {kid['metadata'].get('name')}: {phase}, {turns} turns")
            walk(kid_uid, indent + 1)

    walk(root_uid, 1)
    return lines


# --------------------------------------------------------------------------------------- push


@dataclass(frozen=True)
class PushPlan:
    branch: str


_NEVER_ON_PUSH = ("force", "forceWithLease", "tags", "delete", "mirror", "all", "prune")


def branch_refusal(facts: SessionFacts) -> Refusal | None:
    """Why nothing may be pushed to the session's branch at all, or None: it must match its
    Agent's spec.workspace.branches and differ from the branch its ref names. Asked on every
    push, delivery and land, as if the operator (which fails such a Session first) had been
    bypassed."""
    if not facts.branch:
        return Refusal("this session has no branch to push to")
    refused = session_branch_refusal(
        facts.session_branches,
        facts.branch,
        ref=facts.ref,
        ref_branches=facts.ref_branches,
        agent=facts.agent_ref,
    )
    return None if refused is None else Refusal(f"the custodian pushes nothing: {refused}")


def decide_push(facts: SessionFacts, tool_input: dict[str, Any]) -> PushPlan | Refusal:
    """Push goes to the session's own branch, as a plain fast-forward, or not at all."""
    if facts.read_only:
        return Refusal("a read-only session cannot push")
    protected = branch_refusal(facts)
    if protected is not None:
        return protected
    assert facts.branch is not None  # branch_refusal refuses a session without one
    for flag in _NEVER_ON_PUSH:
        if tool_input.get(flag):
            return Refusal(f"'{flag}' is never allowed: push only fast-forwards {facts.branch}")
    remote = tool_input.get("remote")
    if remote not in (None, "origin"):
        return Refusal("push goes to the session's own remote; 'remote' cannot be changed")
    targets: list[str] = []
    branch = tool_input.get("branch")
    if branch is not None:
        if not isinstance(branch, str):
            return Refusal("'branch' must be a string")
        targets.append(branch)
    refspec = tool_input.get("refspec")
    if refspec is not None:
        if not isinstance(refspec, str):
            return Refusal("'refspec' must be a string")
        parsed = _refspec_target(refspec)
        if isinstance(parsed, Refusal):
            return parsed
        targets.append(parsed)
    for target in targets:
        name = target.removeprefix("refs/heads/")
        if name != facts.branch:
            return Refusal(
                f"push may only target this session's branch {facts.branch!r}, not {target!r}"
            )
    return PushPlan(branch=facts.branch)


_NETWORK_SCHEMES = ("https", "http", "ssh", "git")
# user@host:path, git's scp-like syntax; the host may not start with '-' (an ssh option).
_SCP_LIKE = re.compile(
    r"^[A-Za-z0-9._~+-]+@(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(?!//)\S+$"
)
_HELPER = re.compile(r"^[A-Za-z0-9+.-]+::")


def remote_refusal(url: str | None) -> str | None:
    """Why push and land may not send to `url`, or None for a network remote.

    A local path or file:// would let a push write into any repository the custodian can
    reach (and run that repository's hooks); ext:: and fd:: run commands. Only https, http,
    ssh, git and scp-like user@host:path remotes are allowed.
    """
    if not url:
        return "no push remote is configured (CORRAL_GIT_REMOTE_URL, from spec.workspace.repo)"
    if _HELPER.match(url):
        return (
            f"push remote {url!r} uses a transport helper (ext::, fd::, ...), which runs "
            "commands: never allowed"
        )
    if url.lower().startswith("file:"):
        return f"push remote {url!r} is a file:// URL: pushing to local paths is never allowed"
    if any(c.isspace() or ord(c) < 32 for c in url) or url.startswith("-"):
        return f"push remote {url!r} is not a plain URL"
    scheme, sep, _ = url.partition("://")
    if sep:
        if scheme.lower() not in _NETWORK_SCHEMES:
            return (
                f"push remote {url!r} uses {scheme}://; allowed are https://, http://, ssh://, "
                "git:// and user@host:path"
            )
        try:
            host = urlsplit(url).hostname
        except ValueError:
            host = None
        if not host or host.startswith("-"):
            return f"push remote {url!r} names no host"
        return None
    if _SCP_LIKE.match(url):
        return None
    return (
        f"push remote {url!r} is a local path: pushing to local paths is never allowed; "
        "allowed are https://, http://, ssh://, git:// and user@host:path"
    )


def _refspec_target(refspec: str) -> str | Refusal:
    spec = refspec.strip()
    if spec.startswith("+"):
        return Refusal("a '+' refspec is a force push, which is never allowed")
    if not spec or spec.startswith(":"):
        return Refusal("deleting a remote ref is never allowed")
    if spec.count(":") > 1 or any(c in spec for c in " *^~?[\\"):
        return Refusal(f"refspec {refspec!r} is not a plain 'HEAD:<branch>'")
    src, colon, dst = spec.partition(":")
    if colon and src != "HEAD":
        # The custodian always pushes the workspace's HEAD and nothing else.
        return Refusal("push always sends the workspace's HEAD; the source must be HEAD")
    target = dst if colon else src
    if target.startswith("refs/") and not target.startswith("refs/heads/"):
        return Refusal(f"only branches can be pushed, not {target!r}")
    return target


# --------------------------------------------------------------------------------------- land


@dataclass(frozen=True)
class LandPlan:
    target: str
    revision: str
    digest: str


@dataclass(frozen=True)
class AskApproval:
    """No decision exists yet: the custodian creates a pending Approval for this exact call."""

    tool: str
    arguments: dict[str, Any]
    digest: str
    reason: str


def land_arguments(tool_input: dict[str, Any]) -> dict[str, str] | Refusal:
    target = tool_input.get("target")
    revision = tool_input.get("revision")
    if not isinstance(target, str) or not target or target.startswith("-"):
        return Refusal("'target' must name the branch to land on")
    if not re.fullmatch(r"[A-Za-z0-9._/-]+", target) or ".." in target:
        return Refusal(f"'target' {target!r} is not a valid branch name")
    if not isinstance(revision, str) or not FULL_SHA.match(revision):
        return Refusal("'revision' must be the full 40-character SHA to land")
    return {"target": target.removeprefix("refs/heads/"), "revision": revision}


def decide_land(
    facts: SessionFacts,
    tool_input: dict[str, Any],
    approvals: list[dict[str, Any]],
    evidences: list[dict[str, Any]],
) -> LandPlan | AskApproval | Refusal:
    """Land needs a human's Approval for this exact call, and a Pass Evidence when configured."""
    if facts.read_only:
        return Refusal("a read-only session cannot land changes")
    args = land_arguments(tool_input)
    if isinstance(args, Refusal):
        return args
    if args["target"] == facts.branch:
        return Refusal("landing on the session's own branch is a push; use the push tool")
    # Where land may reach is the Agent's alone; no Approval can widen it.
    outside = landing_target_refusal(facts.land_targets, args["target"])
    if outside is not None:
        return Refusal(outside)
    digest = action_digest("land", args)
    binding = [a for a in approvals if approval_binds(a, facts, "land", digest)]
    # Each Approval's decision is final, but a later request may be decided differently:
    # the newest decided Approval for this exact call is the one that counts.
    decided = sorted(
        (a for a in binding if approval_decision(a) != PENDING),
        key=lambda a: (str(a["metadata"].get("creationTimestamp", "")), a["metadata"]["name"]),
    )
    latest = approval_decision(decided[-1]) if decided else None
    if latest == "Denied":
        return Refusal(
            f"a human denied landing {args['revision']} on {args['target']}; ask again with "
            "request_approval (tool 'land', the same arguments) if something changed"
        )
    if latest != "Approved":
        if binding:
            return Refusal(
                f"landing {args['revision']} on {args['target']} awaits a human's decision"
            )
        return AskApproval(
            tool="land",
            arguments=args,
            digest=digest,
            reason=f"land {args['revision']} on {args['target']}",
        )
    if facts.land_check is not None:
        waiting = evidence_refusal(facts, facts.land_check, args["revision"], evidences)
        if waiting is not None:
            return waiting
    return LandPlan(target=args["target"], revision=args["revision"], digest=digest)


def approval_binds(approval: dict[str, Any], facts: SessionFacts, tool: str, digest: str) -> bool:
    """Does this Approval speak about this exact call by this exact session?

    Another namespace, another session (by uid, not only name), another tool or other
    arguments never count; nor does a digest that does not match its own stated arguments.
    """
    meta = approval.get("metadata") or {}
    spec = approval.get("spec") or {}
    ref = spec.get("sessionRef") or {}
    action = spec.get("action") or {}
    if meta.get("namespace") != facts.namespace:
        return False
    if ref.get("uid") != facts.uid or ref.get("name") != facts.name:
        return False
    if action.get("tool") != tool or action.get("digest") != digest:
        return False
    try:
        stated = json.loads(action.get("arguments", ""))
    except (TypeError, ValueError):
        return False
    return action_digest(tool, stated) == digest


def evidence_refusal(
    facts: SessionFacts, check: LandingCheck, revision: str, evidences: list[dict[str, Any]]
) -> Refusal | None:
    """None when the verdict that counts for the landing check at `revision` is Pass.

    The rule of what counts (labels, spec and the definition digest agree; the newest finished
    verdict wins) is `corral_api.evidence.verdict_for`, shared with the operator and CI gates.
    """
    if facts.repo is None:
        return Refusal("land needs the session's repository, which is unknown here")
    digest = check_definition_digest(check.command, check.image)
    verdict = verdict_for(evidences, check.name, revision, facts.repo, digest, facts.namespace)
    if verdict in ("Missing", "Pending"):
        state = "is still running" if verdict == "Pending" else "does not exist yet"
        return Refusal(
            f"land waits for the Evidence of check {check.name!r} at revision {revision}: it "
            f"{state} (the operator runs the check once a land Approval is pending); call land "
            "again when its verdict is in"
        )
    if verdict != "Pass":
        return Refusal(
            f"the newest Evidence of check {check.name!r} at revision {revision} says "
            f"{verdict}, so this revision cannot land"
        )
    return None


def approval_request(tool_input: dict[str, Any]) -> AskApproval | Refusal:
    """The request_approval tool: ask a human about one exact call."""
    tool = tool_input.get("tool")
    arguments = tool_input.get("arguments", {})
    reason = tool_input.get("reason", "")
    if not isinstance(tool, str) or not tool or len(tool) > 256:
        return Refusal("'tool' must name the tool the approval is for")
    if not isinstance(arguments, dict):
        return Refusal("'arguments' must be an object: the call's exact input")
    if not isinstance(reason, str) or len(reason) > 4096:
        return Refusal("'reason' must be a string of at most 4096 characters")
    return AskApproval(
        tool=tool, arguments=arguments, digest=action_digest(tool, arguments), reason=reason
    )


# Menu tools that check an Approval themselves: the gate's request must be the very action
# the tool will look for, or a `land` would be asked twice (once by the harness's gate, once
# by the custodian) and the first decision would release nothing.
SELF_CHECKING_TOOLS = frozenset({"land"})


def gate_action(ask: AskApproval, facts: SessionFacts | None = None) -> AskApproval | Refusal:
    """The action an approval gate asks about, as the tool that acts will look for it.

    The harness's gate names the call as the model made it (`mcp__corral__land` with the
    model's arguments); `land` looks for tool `land` with its normalised arguments. Any other
    call (`bash` running `git merge`, ...) is asked about exactly as made. With `facts`, a land
    no Approval could release (a target outside the Agent's spec.landing.targets) is refused
    here, before a person is asked about it."""
    bare = ask.tool.removeprefix("mcp__corral__")
    if bare not in SELF_CHECKING_TOOLS:
        return ask
    args = land_arguments(ask.arguments)
    if isinstance(args, Refusal):
        return args
    if facts is not None:
        outside = landing_target_refusal(facts.land_targets, args["target"])
        if outside is not None:
            return Refusal(outside)
    return AskApproval(
        tool=bare,
        arguments=args,
        digest=action_digest(bare, args),
        reason=ask.reason or f"land {args['revision']} on {args['target']}",
    )


def pending_binding(
    approvals: list[dict[str, Any]], facts: SessionFacts, ask: AskApproval
) -> dict[str, Any] | None:
    """A still-pending Approval of this session for this exact action: asked again (a replay
    after a harness restart, the model calling twice), it is reused, never doubled."""
    for approval in approvals:
        if approval_binds(approval, facts, ask.tool, ask.digest) and (
            approval_decision(approval) == PENDING
        ):
            return approval
    return None


def own_approval(approval: dict[str, Any], facts: SessionFacts) -> bool:
    """An Approval this session may wait on: its own (namespace, name, uid), and speaking
    about the call it states (the digest matches its tool and arguments)."""
    action = (approval.get("spec") or {}).get("action") or {}
    return approval_binds(
        approval, facts, str(action.get("tool") or ""), str(action.get("digest") or "")
    )


def approval_manifest(facts: SessionFacts, ask: AskApproval) -> dict[str, Any]:
    """A pending Approval bound to this session by name and uid, owned by the session."""
    slug = re.sub(r"[^a-z0-9-]+", "-", ask.tool.lower())[-20:].strip("-") or "action"
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {
            "generateName": f"{facts.name[:40]}-{slug}-",
            "namespace": facts.namespace,
            "labels": {"corral.dev/session": facts.name[:63]},
            "ownerReferences": [
                {
                    "apiVersion": "corral.dev/v1alpha1",
                    "kind": "Session",
                    "name": facts.name,
                    "uid": facts.uid,
                }
            ],
        },
        "spec": {
            "sessionRef": {"name": facts.name, "uid": facts.uid},
            "action": {
                "tool": ask.tool,
                "arguments": canonical_json(ask.arguments),
                "digest": ask.digest,
            },
            "reason": ask.reason,
        },
    }
