"""Delivery at the end of every turn: the real harness commits what the agent left, the real
custodian pushes it to the session's branch on a real git server (`git daemon` on loopback),
and serves its record to the operator's port (docs/delivery.md)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_api.wire import CustodianDelivery
from corral_dev.scripted import ScriptedModel, parse_script
from tests._scripted import ScriptedServer
from tests.wire._rig import Harness, new_conversation

from ._custodian_proc import Custodian, git, git_daemon, running_custodian

pytestmark = pytest.mark.timeout(120)

AGENT = {
    "identity": "You are a test agent.",
    "model": "corral-scripted",
    "tools": {"allow": ["bash", "mcp__corral__*"]},
}
BRANCH = "corral/s1"
TASK = "Write the greeting file.\nMore detail on a second line."


@dataclass
class Rig:
    model: ScriptedModel
    harness: Harness
    custodian: Custodian
    remote: Path
    root: Path
    conv: str

    def turn(self, steps: list[dict[str, Any]], message: str = TASK) -> dict[str, Any]:
        self.model.set_script(parse_script({"conversations": {self.conv: steps}}))
        admitted = self.harness.admit(self.conv, message, spec=AGENT)
        settled = self.harness.wait_settled(self.conv, admitted["submissionId"], timeout=60)
        assert settled["status"] == "completed", settled
        record = self.delivery()
        assert record["submissionId"] == admitted["submissionId"]
        return record

    def delivery(self) -> dict[str, Any]:
        assert self.custodian.operator_url is not None
        answer = httpx.get(
            self.custodian.operator_url + "/v1/delivery",
            headers={"authorization": f"Bearer {self.custodian.wire_token}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        parsed = CustodianDelivery.model_validate(answer.json())  # the wire shape
        assert parsed.delivery is not None
        return parsed.delivery.model_dump()

    def remote_head(self) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(self.remote), "rev-parse", "--verify", "-q", f"refs/heads/{BRANCH}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return done.stdout.strip() or None


def bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "bash", "input": {"command": command}}}


@pytest.fixture
def rig(tmp_path: Path, scripted: ScriptedServer) -> Iterator[Rig]:
    served = tmp_path / "served"
    served.mkdir()
    remote = served / "remote.git"
    seed = tmp_path / "seed"
    seed.mkdir()
    git(seed, "init", "-q", "-b", "main")
    (seed / "README.md").write_text("# repo\n")
    git(seed, "add", "README.md")
    git(seed, "commit", "-qm", "init")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    root = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(root))
    git(root, "checkout", "-qb", BRANCH)
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "CORRAL_SESSION_BRANCH": BRANCH,
        "CORRAL_STATE_DIR": str(tmp_path / "custodian-state"),
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
    }
    with (
        git_daemon(served) as daemon,
        running_custodian(
            env | {"CORRAL_GIT_REMOTE_URL": daemon + "remote.git"}, tmp_path / "c.log"
        ) as custodian,
    ):
        credential = tmp_path / "c-credential"
        harness = Harness(
            model_url=custodian.url,
            menu_url=custodian.url,
            state_dir=tmp_path / "harness-state",
            root=root,
            extra_env={"CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential)},
        )
        harness.start()
        try:
            yield Rig(scripted.model, harness, custodian, remote, root, new_conversation())
        finally:
            harness.stop()


def test_a_turn_that_changed_the_workspace_is_committed_as_the_agent_and_pushed(rig: Rig) -> None:
    base = git(rig.root, "rev-parse", "HEAD")
    record = rig.turn([bash("echo hello > greeting.txt && rm README.md"), {"text": "Wrote it."}])

    assert record["state"] == "Delivered", record
    revision = record["revision"]
    assert record["branch"] == BRANCH and record["pushedAt"] and record["attempted"] == revision
    # The remote's branch holds the turn's commit, and the local checkout is on it.
    assert rig.remote_head() == revision == git(rig.root, "rev-parse", "HEAD")
    assert git(rig.root, "rev-parse", "HEAD~1") == base
    assert git(rig.root, "status", "--porcelain") == ""
    # As the agent, with the task's first line and the turn's answer.
    assert git(rig.root, "log", "-1", "--format=%an <%ae>") == "agent <agent@agents.corral.invalid>"
    message = git(rig.root, "log", "-1", "--format=%B")
    assert message.splitlines()[0] == "Write the greeting file."
    assert "Wrote it." in message and f"Corral-Session: {rig.conv}" in message
    files = git(rig.remote, "ls-tree", "--name-only", revision).split()
    assert files == ["greeting.txt"]


def test_a_turn_that_changed_nothing_delivers_nothing(rig: Rig) -> None:
    first = rig.turn([{"text": "Nothing to do."}])
    assert first["state"] == "NothingToDeliver", first
    assert first["revision"] is None and rig.remote_head() is None

    pushed = rig.turn([bash("echo one > a.txt"), {"text": "one"}], "next")
    assert pushed["state"] == "Delivered"
    again = rig.turn([bash("cat a.txt"), {"text": "read it"}], "next")
    assert again["state"] == "NothingToDeliver", again
    assert again["revision"] == pushed["revision"] == rig.remote_head()
    assert again["pushedAt"] == pushed["pushedAt"]


def test_the_agents_own_commits_are_delivered_with_the_turn(rig: Rig) -> None:
    commit = "echo x > x.txt && git add x.txt && git -c user.name=a -c user.email=a@a commit -qm m"
    record = rig.turn([bash(commit), {"text": "committed myself"}])
    assert record["state"] == "Delivered"
    assert rig.remote_head() == record["revision"]
    assert git(rig.root, "log", "-1", "--format=%s") == "m"  # nothing left to commit


def test_history_rewritten_by_the_agent_is_refused(rig: Rig) -> None:
    pushed = rig.turn([bash("echo one > a.txt"), {"text": "one"}])
    assert pushed["state"] == "Delivered"
    # The agent throws away the delivered commit and builds another history on the base.
    rewrite = (
        "git reset -q --hard HEAD~1 && echo other > b.txt && git add b.txt && "
        "git -c user.name=a -c user.email=a@a commit -qm rewritten"
    )
    refused = rig.turn([bash(rewrite), {"text": "rewrote"}], "next")
    assert refused["state"] == "Failed", refused
    assert "does not descend from" in refused["message"]
    assert refused["attempted"] == git(rig.root, "rev-parse", "HEAD")
    # The branch keeps what was delivered; the record still names it.
    assert rig.remote_head() == pushed["revision"] == refused["revision"]


def test_a_remote_that_refuses_the_push_is_a_failed_delivery(rig: Rig) -> None:
    hook = rig.remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'protected: pushes are closed' >&2\nexit 1\n")
    hook.chmod(0o755)
    record = rig.turn([bash("echo one > a.txt"), {"text": "one"}])
    assert record["state"] == "Failed", record
    assert "pushes are closed" in record["message"]
    assert record["revision"] is None and rig.remote_head() is None


def test_the_delivery_record_is_the_operators_only(rig: Rig) -> None:
    assert rig.custodian.operator_url is not None
    url = rig.custodian.operator_url + "/v1/delivery"
    assert httpx.get(url, timeout=10).status_code == 401
    wrong = {"authorization": f"Bearer {rig.custodian.credential}"}
    assert httpx.get(url, headers=wrong, timeout=10).status_code == 401
    # Before any delivery the record is empty, not an error.
    ok = {"authorization": f"Bearer {rig.custodian.wire_token}"}
    assert httpx.get(url, headers=ok, timeout=10).json() == {"delivery": None}
    # And the harness-facing deliver endpoint wants the pod-local credential.
    deliver = rig.custodian.url + "/agents/c/deliver"
    assert httpx.post(deliver, json={}, timeout=10).status_code == 401
    bad = httpx.post(
        rig.custodian.url + "/agents/c/deliver",
        json={"revision": "not-a-sha"},
        headers=rig.custodian.headers,
        timeout=10,
    )
    assert bad.status_code == 400 and bad.json()["error"] == "bad_input"
