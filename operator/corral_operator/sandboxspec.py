"""Whether a sandbox can be built from an Agent and a Session: one pure check that the Session
planner runs before it creates anything and the pod builder runs before it builds.

What it finds wrong is a `SandboxSpecError` naming the field; what it resolved on the way (the
repository to clone, the tools container's resources, the budget) the builder uses as is.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from corral_api.kinds import Agent, Budget, Session
from corral_api.providers import ModelProvider, ProviderError, choose_provider

from .budgets import lowest
from .settings import ContainerResources, OperatorSettings

# The workspace volume's mount in every sandbox: the agent's granted root is here or below.
WORKSPACE_MOUNT = "/workspace"


class SandboxSpecError(ValueError):
    """The Agent and Session together cannot make a valid sandbox; the message says why."""


@dataclass(frozen=True)
class CheckedSandbox:
    """What the check resolved of a buildable sandbox."""

    name: str
    namespace: str
    uid: str
    repo: str  # what the checkout clones (a relative repo resolved under the local root)
    tools_resources: dict[str, dict[str, str]]
    budget: Budget  # the custodian's: the one given, else the lower of the Session's and Agent's
    provider: ModelProvider  # where its custodian sends model requests (docs/providers.md)


def check_sandbox(
    agent: Agent,
    session: Session,
    settings: OperatorSettings,
    *,
    budget: Budget | None = None,
) -> CheckedSandbox:
    """Everything that keeps a sandbox from being built, in the order the builder met it;
    SandboxSpecError on the first. `budget` is the Session's effective one, if known."""
    _check_workspace(agent, session)
    name, namespace, uid = session_meta(session)
    repo = resolve_repo(session.spec.workspace.repo, settings.local_repo_root)
    effective = (
        budget if budget is not None else lowest(session.spec.budget, agent.spec.limits.budget)
    )
    check_budget(effective)
    provider = provider_for(agent, settings)
    return CheckedSandbox(
        name=name,
        namespace=namespace,
        uid=uid,
        repo=repo,
        tools_resources=tools_resources(agent, settings.resources.tools),
        budget=effective,
        provider=provider,
    )


def provider_for(agent: Agent, settings: OperatorSettings) -> ModelProvider:
    """The platform's provider the Agent names (or the default), and a check that the Agent
    holds the credential it needs; SandboxSpecError naming the field otherwise."""
    try:
        provider = choose_provider(
            settings.model_providers, agent.spec.provider, settings.model_upstream_url
        )
    except ProviderError as e:
        raise SandboxSpecError(f"spec.provider: {e}") from None
    creds = agent.spec.credentials
    if provider.type == "bedrock" and creds.aws_secret_ref is None and not provider.web_identity:
        raise SandboxSpecError(
            f"provider {provider.name!r} (bedrock) needs credentials.awsSecretRef: the platform "
            "has not enabled the cluster's web identity for it"
        )
    if provider.type == "vertex" and creds.gcp_secret_ref is None:
        raise SandboxSpecError(
            f"provider {provider.name!r} (vertex) needs credentials.gcpSecretRef (a Google "
            "service-account key)"
        )
    return provider


def session_meta(session: Session) -> tuple[str, str, str]:
    """The Session's name, namespace and uid; SandboxSpecError when one is missing."""
    md = session.metadata
    try:
        return str(md["name"]), str(md["namespace"]), str(md["uid"])
    except KeyError as missing:
        raise SandboxSpecError(f"Session metadata lacks {missing.args[0]}") from None


def _check_workspace(agent: Agent, session: Session) -> None:
    ws = session.spec.workspace
    if ws.ref.startswith("-"):
        raise SandboxSpecError(f"spec.workspace.ref {ws.ref!r} must not start with '-'")
    if ws.repo.startswith("-"):
        raise SandboxSpecError(f"spec.workspace.repo {ws.repo!r} must not start with '-'")
    if any(c in ws.ref for c in " \t\n\\~^:?*["):
        raise SandboxSpecError(f"spec.workspace.ref {ws.ref!r} is not a valid git ref")
    problem = granted_root_problem(ws.granted_root)
    if problem is not None:
        raise SandboxSpecError(problem)
    if session.spec.agent_ref != agent.metadata.get("name"):
        raise SandboxSpecError(
            f"Session names Agent {session.spec.agent_ref!r}, given {agent.metadata.get('name')!r}"
        )


def check_budget(budget: Budget) -> None:
    """SandboxSpecError when an axis of the budget is spent before the Session starts."""
    if budget.tokens is not None and budget.tokens < 1:
        raise SandboxSpecError("the Session's token budget is spent before it starts")
    if budget.cost_usd is not None and budget.cost_usd <= 0:
        raise SandboxSpecError("the Session's cost budget is spent before it starts")


def granted_root_problem(granted_root: str) -> str | None:
    """Why `granted_root` cannot be the agent's root (the API server's CEL rule, again), or None.

    The workspace volume is always mounted at /workspace, so the root is /workspace or below:
    anything else would hand the agent the image's own files (e.g. /opt/corral/bin).
    """
    inside = granted_root == WORKSPACE_MOUNT or granted_root.startswith(WORKSPACE_MOUNT + "/")
    parts = granted_root.split("/")
    if not inside or ".." in parts or "." in parts or "//" in granted_root:
        return (
            f"spec.workspace.grantedRoot {granted_root!r} must be /workspace or a path below it, "
            "without '.', '..' or '//' (the workspace volume is always mounted at /workspace)"
        )
    if any(c in granted_root for c in "\0\n\r"):
        return f"spec.workspace.grantedRoot {granted_root!r} holds a control character"
    return None


def is_relative_repo(repo: str) -> bool:
    """A relative path, as git would read `repo`: not absolute, not a URL, not `host:path`."""
    if repo.startswith("/") or "://" in repo:
        return False
    colon, slash = repo.find(":"), repo.find("/")
    scp_like = colon > 0 and (slash < 0 or colon < slash)  # git@host:org/repo, host:repo
    return not scp_like


def resolve_repo(repo: str, local_repo_root: str | None) -> str:
    """The repository the checkout clones: `repo` itself, or a relative one under the root.

    A relative `workspace.repo` (what `corral run` resolves against the YAML's directory) means
    nothing to a cluster, so it is refused unless the operator runs with a local repo root, a
    development aid for local clusters: a directory on the node, or the base URL of a git
    server (`make dev-cluster` serves the examples' `demo/repo` so, and the custodian can push
    there). The check is lexical (no I/O here): after normalisation the path must stay
    strictly inside the root, so `..` cannot leave it.
    """
    if not is_relative_repo(repo):
        return repo
    if local_repo_root is None:
        raise SandboxSpecError(
            f"workspace.repo {repo!r} is a relative path, which a cluster cannot clone; give a "
            "git URL or an absolute path (relative paths work only with an operator started "
            "with --local-repo-root, a development aid for local clusters)"
        )
    if "://" in local_repo_root:
        base = local_repo_root.rstrip("/")
        path = posixpath.normpath(repo)
        if path in (".", "..") or path.startswith("../"):
            raise SandboxSpecError(
                f"workspace.repo {repo!r} is not inside the local repo root {local_repo_root!r}"
            )
        return f"{base}/{path}"
    root = posixpath.normpath(local_repo_root)
    if not posixpath.isabs(root):
        raise SandboxSpecError(f"the local repo root {local_repo_root!r} is not absolute")
    resolved = posixpath.normpath(posixpath.join(root, repo))
    if not resolved.startswith(root.rstrip("/") + "/"):
        raise SandboxSpecError(
            f"workspace.repo {repo!r} is not inside the local repo root {local_repo_root!r}"
        )
    return resolved


# ------------------------------------------------------------------------------ resources

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def quantity(text: str, where: str) -> Decimal:
    """A Kubernetes quantity (`500m`, `1Gi`, `2e3`) as a number; SandboxSpecError otherwise."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise SandboxSpecError(f"{where} {text!r} is not a Kubernetes quantity (e.g. 500m, 1Gi)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation:
        raise SandboxSpecError(f"{where} {text!r} is not a Kubernetes quantity") from None


def tools_resources(agent: Agent, defaults: ContainerResources) -> dict[str, dict[str, str]]:
    """The tools container's requests and limits: the Agent's where it sets them, else the
    defaults, so both are always there. A default limit below the Agent's request rises to it;
    an Agent's own limit below its own request is refused."""
    base = defaults.wire()
    requests, limits = dict(base["requests"]), dict(base["limits"])
    own_limits: set[str] = set()
    res = agent.spec.sandbox.resources
    if res is not None:
        requests.update(res.requests.wire() if res.requests else {})
        own = res.limits.wire() if res.limits else {}
        limits.update(own)
        own_limits.update(own)
    for key in sorted(set(requests) | set(limits)):
        where = "spec.sandbox.resources"
        wanted = quantity(requests[key], f"{where}.requests.{key}") if key in requests else None
        cap = quantity(limits[key], f"{where}.limits.{key}") if key in limits else None
        if wanted is None or cap is None or wanted <= cap:
            continue
        if key in own_limits:
            raise SandboxSpecError(
                f"{where}.requests.{key} {requests[key]!r} is above "
                f"{where}.limits.{key} {limits[key]!r}"
            )
        limits[key] = requests[key]
    return {"requests": requests, "limits": limits}
