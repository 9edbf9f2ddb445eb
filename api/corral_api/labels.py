"""Label keys and values shared by the operator, the custodian and CI gates.

Evidence is selected by labels (check name, revision, repository), and a repository URL is not
a valid label value, so it is carried as a hash of the URL.
"""

from __future__ import annotations

import hashlib

EVIDENCE_CHECK = "corral.dev/check"
EVIDENCE_REVISION = "corral.dev/revision"
EVIDENCE_REPO = "corral.dev/repo-hash"
EVIDENCE_SESSION = "corral.dev/session"


def repo_hash(repo_url: str) -> str:
    """A label-safe stand-in for a repository URL: the first 40 hex digits of its sha256."""
    return hashlib.sha256(repo_url.strip().encode("utf-8")).hexdigest()[:40]


def evidence_labels(check: str, revision: str, repo_url: str) -> dict[str, str]:
    return {
        EVIDENCE_CHECK: check,
        EVIDENCE_REVISION: revision,
        EVIDENCE_REPO: repo_hash(repo_url),
    }


def evidence_selector(check: str, revision: str, repo_url: str) -> str:
    """A label selector for exactly this check at this revision of this repository."""
    return ",".join(f"{k}={v}" for k, v in evidence_labels(check, revision, repo_url).items())
