"""`corral run` asks a person before a landing (docs/approvals.md): with `--approvals approve`
the demo's fix is merged onto the session's branch, with `--approvals deny` it is not. The ask
goes through the local custodian's approval gate and its file store, as in a pod it goes
through the custodian to an Approval resource."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import EXAMPLES, corral_run, git, unittest_passes

pytestmark = pytest.mark.timeout(180)

SCENARIO = EXAMPLES / "demo" / "scenario-land.yaml"


def _run(tmp_path: Path, mode: str) -> tuple[int, str, Path, list[dict[str, object]]]:
    state = tmp_path / "state"
    done = corral_run(
        "-f", str(EXAMPLES / "session.yaml"), "--scenario", str(SCENARIO),
        "--approvals", mode, "--json", state_dir=state,
    )  # fmt: skip
    records = [
        json.loads(p.read_text())
        for p in sorted((state / "custodian" / "approvals").glob("*.json"))
    ]
    return done.code, done.stderr + done.stdout, state / "workspace", records


def test_an_approved_merge_lands_the_demo_fix_on_its_branch(tmp_path: Path) -> None:
    code, output, workspace, records = _run(tmp_path, "approve")
    assert code == 0, output
    # One request, for the one action that always asks, decided by the run's mode.
    assert [(r["tool"], r["decision"], r["decidedBy"]) for r in records] == [
        ("bash", "approved", "corral run --approvals approve")
    ]
    assert "git merge --ff-only fix/discount" in str(records[0]["input"])
    assert git(workspace, "rev-parse", "--abbrev-ref", "HEAD").strip() == "corral/fix-discount"
    assert git(workspace, "rev-parse", "corral/fix-discount") == git(
        workspace, "rev-parse", "fix/discount"
    )
    assert "discount_percent / 100" in (workspace / "shop" / "pricing.py").read_text()
    assert unittest_passes(workspace)


def test_a_denied_merge_leaves_the_branch_as_it_was(tmp_path: Path) -> None:
    # The session itself may succeed (the fix is on the topic branch, where the workspace
    # stays); what the refusal changes is that nothing is merged onto the session's branch.
    _, output, workspace, records = _run(tmp_path, "deny")
    assert [(r["tool"], r["decision"]) for r in records] == [("bash", "denied")]
    assert "A human denied this call of bash" in output
    before = git(workspace, "rev-parse", "corral/fix-discount")
    assert before != git(workspace, "rev-parse", "fix/discount")
    assert "discount_percent / 100" in git(workspace, "show", "fix/discount:shop/pricing.py")
    assert "discount_percent / 100" not in git(
        workspace, "show", "corral/fix-discount:shop/pricing.py"
    )
