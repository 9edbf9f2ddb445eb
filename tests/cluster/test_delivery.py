"""The work outlives the pod: the example Session's fix is on its branch in a real git server
(`git daemon` on loopback) after the sandbox pod is gone, and its revision is in the Session's
status; a remote that refuses the push turns a would-be success into `DeliveryFailed`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.custodian._custodian_proc import git, git_daemon

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Outside /tmp, which the local node maps onto each pod's own /tmp volume.
_SERVED = Path.home() / ".cache" / "corral" / "test-repos"


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


def _remote_head(remote: Path, branch: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(remote), "rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or None


@pytest.fixture
def served() -> Iterator[tuple[Path, str]]:
    """A directory of bare repositories and the git:// URL `git daemon` serves it at."""
    _SERVED.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="served-", dir=_SERVED))
    try:
        with git_daemon(base) as url:
            yield base, url
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _bare_repo_of(source: Path, remote: Path) -> None:
    work = remote.parent / (remote.stem + "-seed")
    shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__"))
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "the example repository")
    git(remote.parent, "clone", "-q", "--bare", str(work), str(remote))


def test_the_example_sessions_fix_is_on_its_branch_after_the_pod_is_gone(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, served: tuple[Path, str]
) -> None:
    base, url = served
    remote = base / "shop.git"
    _bare_repo_of(EXAMPLES / "demo" / "repo", remote)
    agent = yaml.safe_load((EXAMPLES / "agent.yaml").read_text())
    session = yaml.safe_load((EXAMPLES / "session.yaml").read_text())
    name, branch = session["metadata"]["name"], session["spec"]["workspace"]["branch"]
    assert branch == "corral/fix-discount"
    session["spec"]["workspace"]["repo"] = url + "shop.git"
    scenario = yaml.safe_load((EXAMPLES / "demo" / "scenario.yaml").read_text())
    scripted_model.load({"conversations": {name: scenario["default"]}})
    base_revision = git(remote, "rev-parse", "main")

    operator.apply(agent, session)
    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=150)
    assert status["phase"] == "Succeeded", status

    delivery = status["delivery"]
    assert delivery["state"] == "Delivered", delivery
    assert delivery["branch"] == branch and delivery["pushedAt"]
    revision = delivery["revision"]
    assert len(revision) == 40
    delivered = _condition(status, "Delivered")
    assert (delivered["status"], delivered["reason"]) == ("True", "Delivered")
    # The pod is gone; the fix is not.
    wait_for("the sandbox pod to go", lambda: operator.get("pod", f"corral-{name}") is None)
    assert _remote_head(remote, branch) == revision
    assert git(remote, "rev-parse", f"{revision}~1") == base_revision
    fixed = git(remote, "show", f"{revision}:shop/pricing.py")
    assert "discount = subtotal * discount_percent / 100" in fixed
    assert git(remote, "log", "-1", "--format=%an", revision) == "fixer"
    assert git(remote, "rev-parse", "main") == base_revision  # only its own branch moved
    # The revision is a printer column.
    table = operator.cp.kubectl("get", "session", name, "-n", operator.namespace, "-o", "wide")
    assert "REVISION" in table.stdout.splitlines()[0] and revision in table.stdout


def test_a_remote_that_refuses_the_push_fails_the_session_with_delivery_failed(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, served: tuple[Path, str]
) -> None:
    base, url = served
    remote = base / "closed.git"
    source = base / "closed-src"
    source.mkdir()
    (source / "README.md").write_text("# closed\n")
    _bare_repo_of(source, remote)
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'protected: this remote takes no pushes' >&2\nexit 1\n")
    hook.chmod(0o755)
    name = f"{operator.namespace}-refused"
    steps = [
        {"tool_use": {"name": "bash", "input": {"command": "echo work > work.txt"}}},
        {"text": "The work is done."},
    ]
    scripted_model.load({"conversations": {name: steps}})
    doc = session_doc(name, remote)
    doc["spec"]["workspace"]["repo"] = url + "closed.git"
    operator.apply(agent_doc(), doc)

    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=120)
    assert status["phase"] == "Failed", status
    assert _condition(status, "Failed")["reason"] == "DeliveryFailed"
    assert _condition(status, "Succeeded")["status"] == "False"
    delivered = _condition(status, "Delivered")
    assert (delivered["status"], delivered["reason"]) == ("False", "DeliveryFailed")
    assert "takes no pushes" in delivered["message"]
    assert status["delivery"]["state"] == "Failed" and "revision" not in status["delivery"]
    assert "not delivered" in status["message"]
    assert _remote_head(remote, f"corral/{name}") is None


def test_a_session_on_a_local_path_repo_succeeds_and_says_nothing_was_delivered(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-local"
    steps = [
        {"tool_use": {"name": "bash", "input": {"command": "echo work > work.txt"}}},
        {"text": "Done."},
    ]
    scripted_model.load({"conversations": {name: steps}})
    operator.apply(agent_doc(), session_doc(name, git_repo))

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    delivered = _condition(status, "Delivered")
    assert (delivered["status"], delivered["reason"]) == ("False", "NoRemote")
