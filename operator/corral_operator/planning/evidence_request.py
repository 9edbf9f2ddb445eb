"""Which Evidence the operator creates, and what it looks like. Pure: dicts in, dicts out.

Evidence comes only from the operator (the sandbox's identity cannot create it), so a verdict
is produced by trusted hands and bound to a revision and to the check's definition:

- `build_evidence`: check + repository + full revision (+ the Session it is for) -> the
  Evidence manifest: a deterministic DNS-safe name, the labels CI selects by
  (`corral_api.labels.evidence_labels`, plus `corral.dev/session`), `spec.definitionDigest`
  (`corral_api.digest.check_definition_digest`), the check's egress, owned by the Session.
- `wanted_for_approval`: an Approval for `land` (or `merge`) that is not denied, bound to a live
  Session whose effective landing check is set, naming a full revision -> what to run.
- `plan_evidence_creation`: idempotence: nothing when an Evidence for the same check, revision,
  repository and definition digest exists already.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral_api import API_VERSION
from corral_api.decisions import APPROVED, PENDING, approval_decision
from corral_api.digest import action_digest, check_definition_digest
from corral_api.evidence import evidence_counts
from corral_api.kinds import LandingCheck
from corral_api.labels import EVIDENCE_SESSION, evidence_labels

from .. import naming

# Control tools whose Approval means a revision is about to land.
LANDING_TOOLS = frozenset({"land", "merge"})
ANNOTATION_TRIGGER = "corral.dev/requested-by"
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_NAME_CHECK_ROOM = 38  # check[:38] + "-" + 12 revision digits + "-" + 10 hash digits = 62


@dataclass(frozen=True)
class EvidenceWanted:
    """One check to run at one revision of one repository, for a Session (or for nobody)."""

    namespace: str
    check: LandingCheck
    repo: str
    revision: str
    session_name: str | None = None
    session_uid: str | None = None
    requested_by: str | None = None  # e.g. "Approval/<name>", kept as an annotation

    @property
    def digest(self) -> str:
        return check_definition_digest(self.check.command, self.check.image)


def evidence_name(check: str, revision: str, repo: str, digest: str) -> str:
    """Deterministic and DNS-safe: the check, the revision's prefix, and a short hash that
    tells apart other repositories and other definitions of the same check."""
    key = hashlib.sha256(f"{check}\n{repo}\n{digest}".encode()).hexdigest()[:10]
    return f"{check[:_NAME_CHECK_ROOM].rstrip('-')}-{revision[:12]}-{key}"


def build_evidence(wanted: EvidenceWanted) -> dict[str, Any]:
    check, digest = wanted.check, wanted.digest
    labels = {
        **evidence_labels(check.name, wanted.revision, wanted.repo),
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }
    metadata: dict[str, Any] = {
        "name": evidence_name(check.name, wanted.revision, wanted.repo, digest),
        "namespace": wanted.namespace,
        "labels": labels,
    }
    if wanted.requested_by:
        metadata["annotations"] = {ANNOTATION_TRIGGER: wanted.requested_by}
    if wanted.session_name and wanted.session_uid:
        # A label, not an owner: a verdict is about a revision and outlives the Session that
        # asked for it, so a CI gate can still read it after the Session's TTL removed it.
        labels[EVIDENCE_SESSION] = naming.label_value(wanted.session_name)
    spec: dict[str, Any] = {
        "repo": wanted.repo,
        "revision": wanted.revision,
        "check": check.name,
        "command": check.command,
        "definitionDigest": digest,
        "egress": [rule.wire() for rule in check.egress],
    }
    if check.image is not None:
        spec["image"] = check.image
    return {"apiVersion": API_VERSION, "kind": "Evidence", "metadata": metadata, "spec": spec}


def plan_evidence_creation(
    wanted: EvidenceWanted, existing: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The Evidence to create, or None when one for the same (check, revision, repo, digest)
    exists in the namespace already."""
    for evidence in existing:
        if evidence_counts(
            evidence,
            wanted.check.name,
            wanted.revision,
            wanted.repo,
            wanted.digest,
            namespace=wanted.namespace,
        ):
            return None
    return build_evidence(wanted)


# ------------------------------------------------------------------------------- triggers


def _landing_check(spec: Any) -> LandingCheck | None:
    landing = spec.get("landing") if isinstance(spec, dict) else None
    raw = landing.get("check") if isinstance(landing, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return LandingCheck.model_validate(raw)
    except ValidationError:
        return None


def session_needs_agent(session: dict[str, Any]) -> bool:
    """Whether the Session's landing check comes from its Agent (it sets none itself)."""
    return _landing_check(session.get("spec")) is None


def effective_landing_check(
    session: dict[str, Any], agent: dict[str, Any] | None
) -> LandingCheck | None:
    """The Session's `spec.landing.check`, else its Agent's, else None."""
    own = _landing_check(session.get("spec"))
    if own is not None or agent is None:
        return own
    return _landing_check(agent.get("spec"))


def landing_revision(approval: dict[str, Any]) -> str | None:
    """The full revision a `land`/`merge` Approval is about, when it still may be acted on.

    None for another tool, a denied request, arguments that are not an object naming a full
    SHA, or a digest that does not match the stated arguments (no custodian would act on it).
    """
    spec = approval.get("spec") or {}
    action = spec.get("action") or {}
    tool = action.get("tool")
    if tool not in LANDING_TOOLS:
        return None
    if approval_decision(approval) not in (PENDING, APPROVED):
        return None
    try:
        arguments = json.loads(action.get("arguments") or "")
    except (TypeError, ValueError):
        return None
    if not isinstance(arguments, dict) or action.get("digest") != action_digest(tool, arguments):
        return None
    revision = arguments.get("revision")
    return revision if isinstance(revision, str) and _FULL_SHA.match(revision) else None


def wanted_for_approval(
    approval: dict[str, Any], session: dict[str, Any] | None, agent: dict[str, Any] | None
) -> EvidenceWanted | None:
    """The Evidence a landing Approval calls for, or None (no check, no revision, no binding)."""
    revision = landing_revision(approval)
    if revision is None or session is None:
        return None
    a_meta, s_meta = approval.get("metadata") or {}, session.get("metadata") or {}
    ref = (approval.get("spec") or {}).get("sessionRef") or {}
    namespace = a_meta.get("namespace")
    if (
        not namespace
        or s_meta.get("namespace") != namespace
        or ref.get("name") != s_meta.get("name")
        or not ref.get("uid")
        or ref.get("uid") != s_meta.get("uid")
        or s_meta.get("deletionTimestamp")
    ):
        return None
    if agent is not None and (agent.get("metadata") or {}).get("name") != (
        session.get("spec") or {}
    ).get("agentRef"):
        agent = None
    check = effective_landing_check(session, agent)
    repo = ((session.get("spec") or {}).get("workspace") or {}).get("repo")
    if check is None or not isinstance(repo, str) or not repo:
        return None
    return EvidenceWanted(
        namespace=str(namespace),
        check=check,
        repo=repo,
        revision=revision,
        session_name=str(s_meta["name"]),
        session_uid=str(s_meta["uid"]),
        requested_by=f"Approval/{a_meta.get('name')}",
    )
