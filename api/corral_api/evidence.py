"""Reading Evidence: which verdict counts for one check of one revision of one repository.

For every consumer of verdicts (the custodian before `land`, a CI gate): pure, no I/O. Give it
the Evidence objects you listed (ideally with `labels.evidence_selector`) and what you need a
verdict for; the answer never counts an Evidence that speaks about something else:

- its labels must name this check, revision and repository (`labels.evidence_labels`), and its
  spec must say the same (a label can be edited, the spec is immutable);
- its `spec.definitionDigest` must equal the digest you expect, and must be the digest of the
  command and image it actually ran: a verdict for another definition of the check (another
  command, another image) does not count;
- among those that count, the newest finished verdict (by `status.finished`) wins; at the same
  instant a Fail or an Error beats a Pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from .digest import check_definition_digest
from .labels import evidence_labels, repo_hash

Verdict = Literal["Pass", "Fail", "Error", "Pending", "Missing"]
FINAL_VERDICTS: tuple[str, ...] = ("Pass", "Fail", "Error")

# At the same finishing instant the more cautious verdict wins.
_CAUTION = {"Pass": 0, "Fail": 1, "Error": 2}


def _section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def evidence_counts(
    evidence: Mapping[str, Any],
    check: str,
    revision: str,
    repo: str,
    digest: str,
    namespace: str | None = None,
) -> bool:
    """Does this Evidence speak about exactly this check, revision, repository and definition?"""
    meta, spec = _section(evidence, "metadata"), _section(evidence, "spec")
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    labels = _section(meta, "labels")
    if any(labels.get(k) != v for k, v in evidence_labels(check, revision, repo).items()):
        return False
    command, image = spec.get("command"), spec.get("image")
    if not isinstance(command, str) or not (image is None or isinstance(image, str)):
        return False
    return (
        spec.get("check") == check
        and spec.get("revision") == revision
        and isinstance(spec.get("repo"), str)
        and repo_hash(str(spec.get("repo"))) == repo_hash(repo)
        and spec.get("definitionDigest") == digest
        and check_definition_digest(command, image) == digest
    )


def finished_at(evidence: Mapping[str, Any]) -> datetime | None:
    """When its verdict was written; None while it has none (or no readable finishing time)."""
    status = _section(evidence, "status")
    if status.get("verdict") not in FINAL_VERDICTS:
        return None
    text = status.get("finished")
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def verdict_for(
    evidences: Iterable[Mapping[str, Any]],
    check: str,
    revision: str,
    repo: str,
    digest: str,
    namespace: str | None = None,
) -> Verdict:
    """The verdict that counts: Pass, Fail or Error; Pending while only unfinished Evidence
    counts; Missing when no Evidence counts at all."""
    counting = [
        e for e in evidences if evidence_counts(e, check, revision, repo, digest, namespace)
    ]
    if not counting:
        return "Missing"
    finished: list[tuple[datetime, int, str]] = []
    for evidence in counting:
        when = finished_at(evidence)
        if when is not None:
            verdict = str(_section(evidence, "status")["verdict"])
            finished.append((when, _CAUTION[verdict], verdict))
    if not finished:
        return "Pending"
    newest = max(finished)
    if newest[2] == "Pass":
        return "Pass"
    return "Fail" if newest[2] == "Fail" else "Error"


def verdicts_at(
    evidences: Iterable[Mapping[str, Any]],
    revision: str,
    repo: str,
    check: str | None = None,
    namespace: str | None = None,
) -> dict[str, Verdict]:
    """For a CI gate, which knows the repository and revision but not each check's definition:
    the verdict per check name (only `check`, when given) at `revision` of `repo`.

    A check's definition is taken from its most recently created Evidence (the check as it is
    defined now); only Evidence of that definition counts, by the rule of `verdict_for`. An
    Evidence whose digest is not that of the command and image it states counts for nothing.
    """
    items = list(evidences)
    newest: dict[str, tuple[str, str]] = {}  # check -> (creationTimestamp, digest)
    for evidence in items:
        spec = _section(evidence, "spec")
        name, digest = spec.get("check"), spec.get("definitionDigest")
        if not isinstance(name, str) or not isinstance(digest, str):
            continue
        if check is not None and name != check:
            continue
        if not evidence_counts(evidence, name, revision, repo, digest, namespace):
            continue
        created = str(_section(evidence, "metadata").get("creationTimestamp") or "")
        if name not in newest or created > newest[name][0]:
            newest[name] = (created, digest)
    return {
        name: verdict_for(items, name, revision, repo, digest, namespace)
        for name, (_, digest) in sorted(newest.items())
    }
