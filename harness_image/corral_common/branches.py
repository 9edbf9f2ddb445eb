"""Protected branches: which branch a Session may push to, and which branches `land` may reach.

One pure matcher shared by the operator (a Session whose branch is outside its Agent's patterns
fails `InvalidSpec` before a pod exists), the custodian (it refuses the same on every push,
delivery and land, as if the operator had been bypassed) and `corral run`.

A pattern (Agent `spec.workspace.branches`, `spec.landing.targets`; its syntax is
`corral_api.kinds.BRANCH_PATTERN_RULE`) is matched against the whole short branch name: `*`
matches a run of characters without `/`, `**` a run that may contain `/`, everything else
itself. A name that is not a short branch name (`refs/heads/main`, `HEAD`) matches nothing, so
no pattern reaches across a `refs/heads/` prefix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from corral_api.kinds import BRANCH_MESSAGE, DEFAULT_SESSION_BRANCHES, Agent, Session

__all__ = [
    "DEFAULT_SESSION_BRANCHES",
    "branch_name_problem",
    "default_session_branch",
    "landing_target_refusal",
    "matching_pattern",
    "pattern_matches",
    "ref_branch",
    "session_branch_refusal",
    "session_refusal",
]

_BRANCH_CHARS = re.compile(r"^[A-Za-z0-9._/-]+$")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# The remote-tracking spellings of a branch of the one remote a checkout has.
_REMOTE_PREFIXES = ("refs/remotes/origin/", "origin/")


def branch_name_problem(name: str) -> str | None:
    """Why `name` is not a short branch name a pattern may match, or None."""
    if name == "HEAD":
        return "'HEAD' is not a branch name"
    if name.startswith("refs/"):
        return f"{name!r} is a full ref name; name the short branch (without refs/heads/)"
    ok = (
        _BRANCH_CHARS.match(name)
        and not name.startswith(("/", "-"))
        and not name.endswith(("/", ".lock"))
        and ".." not in name
        and "//" not in name
    )
    return None if ok else f"{name!r} {BRANCH_MESSAGE}"


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def pattern_matches(pattern: str, branch: str) -> bool:
    """Whether the short branch name `branch` matches `pattern` (whole name)."""
    if branch_name_problem(branch) is not None or pattern.startswith("refs/"):
        return False
    return _compiled(pattern).fullmatch(branch) is not None


def matching_pattern(patterns: Sequence[str], branch: str) -> str | None:
    """The first of `patterns` that `branch` matches, or None."""
    return next((p for p in patterns if pattern_matches(p, branch)), None)


def ref_branch(ref: str | None) -> str | None:
    """The branch a Session's `spec.workspace.ref` names by itself, or None when it names none
    that can be known without the remote (`HEAD`, a full SHA, a tag, another kind of ref).

    `main`, `refs/heads/main`, `origin/main` and `refs/remotes/origin/main` all name `main`;
    `HEAD` names the remote's default branch, which only the remote knows (the checkout, which
    has the clone, resolves it)."""
    if not ref or ref == "HEAD" or _FULL_SHA.match(ref):
        return None
    if ref.startswith("refs/heads/"):
        name = ref.removeprefix("refs/heads/")
    else:
        name = next((ref.removeprefix(p) for p in _REMOTE_PREFIXES if ref.startswith(p)), ref)
        if name == "HEAD" or (ref.startswith("refs/") and name == ref):
            return None
    return name if branch_name_problem(name) is None else None


def _listed(patterns: Sequence[str]) -> str:
    return ", ".join(patterns) if patterns else "none"


def session_branch_refusal(
    patterns: Sequence[str],
    branch: str,
    *,
    ref: str | None = None,
    ref_branches: Sequence[str] = (),
    agent: str | None = None,
) -> str | None:
    """Why `branch` cannot be a Session's branch, or None when it may be.

    It must be a short branch name, match one of its Agent's `patterns`
    (`spec.workspace.branches`), and differ from the branch the Session's `ref` names
    (`ref_branch(ref)`, plus `ref_branches` the caller resolved, e.g. the remote's HEAD): a
    Session never writes onto the branch its work starts from; that is what land is for.
    """
    whose = f"Agent {agent!r}'s" if agent else "its Agent's"
    problem = branch_name_problem(branch)
    if problem is not None:
        return f"spec.workspace.branch: {problem}"
    if matching_pattern(patterns, branch) is None:
        return (
            f"spec.workspace.branch {branch!r} is outside {whose} spec.workspace.branches "
            f"({_listed(patterns)}): a session pushes only to a branch its Agent allows; "
            "other branches are reached through land"
        )
    named = ref_branch(ref)
    starts_from = [b for b in (named, *ref_branches) if b]
    if branch in starts_from:
        return (
            f"spec.workspace.branch {branch!r} is the branch spec.workspace.ref {ref!r} names: "
            "a session never pushes onto the branch its work starts from; name another "
            "branch, and land the work there"
        )
    return None


def default_session_branch(session: str) -> str:
    """The branch of a Session that names none: `corral/<session>` (DEFAULT_SESSION_BRANCHES
    holds it)."""
    return f"corral/{session}"


def session_refusal(session: Session, agent: Agent) -> str | None:
    """Why `session` may not run under `agent` with its branch (spec.workspace.branch, else
    the default), or None. The operator fails such a Session `InvalidSpec` and `corral run`
    refuses it at start; a read-only Session pushes nothing, so has no branch to check."""
    if session.spec.read_only:
        return None
    workspace = session.spec.workspace
    branch = workspace.branch or default_session_branch(str(session.metadata.get("name", "")))
    refused = session_branch_refusal(
        agent.spec.workspace.branches,
        branch,
        ref=workspace.ref,
        agent=str(agent.metadata.get("name") or session.spec.agent_ref),
    )
    if refused is not None and workspace.branch is None:
        refused += f" (spec.workspace.branch is unset, so the default {branch} applies)"
    return refused


def landing_target_refusal(targets: Sequence[str] | None, target: str) -> str | None:
    """Why `land` may not reach `target`, or None when one of the Agent's `targets`
    (`spec.landing.targets`) matches it."""
    if not targets:
        return "this Agent lists no landing targets: spec.landing.targets"
    problem = branch_name_problem(target)
    if problem is not None:
        return f"landing target {problem}"
    if matching_pattern(targets, target) is None:
        return (
            f"landing target {target!r} is outside this Agent's spec.landing.targets "
            f"({_listed(targets)})"
        )
    return None
