"""`corral run` leaves the turn's commit on the session's branch in the local repository, as
the operator's sandbox does before its custodian pushes it (docs/delivery.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import EXAMPLES, corral_run, git

pytestmark = pytest.mark.timeout(120)


def test_corral_run_commits_the_fix_on_the_session_branch(tmp_path: Path) -> None:
    done = corral_run("-f", str(EXAMPLES / "session.yaml"), state_dir=tmp_path / "state")
    assert done.code == 0, done.stderr + done.stdout

    workspace = done.state_dir / "workspace"
    assert git(workspace, "rev-parse", "--abbrev-ref", "HEAD").strip() == "corral/fix-discount"
    assert git(workspace, "status", "--porcelain") == ""
    changed = git(workspace, "diff", "--name-only", "HEAD~1", "HEAD").split()
    assert changed == ["shop/pricing.py"]
    author = git(workspace, "log", "-1", "--format=%an <%ae>").strip()
    assert author == "fixer <fixer@agents.corral.invalid>"
    message = git(workspace, "log", "-1", "--format=%B")
    assert message.startswith("The test suite of this repository fails")
    assert "divides the percentage by 100" in message
    assert "Corral-Session: fix-discount" in message
