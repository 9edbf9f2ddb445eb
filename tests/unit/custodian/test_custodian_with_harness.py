"""The real harness behind the real custodian, as in a sandbox pod: the harness's model base URL
and Menu are the custodian; the scripted model is the upstream. The agent's own shell looks for
the key and finds nothing; the model's push goes to the session's branch through the Menu.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests._scripted import ScriptedServer
from tests.wire._rig import Harness, new_conversation

from ._custodian_proc import git_daemon, running_custodian

pytestmark = pytest.mark.timeout(90)

MODEL_KEY = "sk-ant-only-in-the-custodian-4242"
AGENT = {
    "identity": "You are a test agent.",
    "model": "corral-scripted",
    "tools": {"allow": ["bash", "mcp__corral__*"]},
}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t",
             "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"},
    )  # fmt: skip
    return done.stdout.strip()


def test_the_harness_never_holds_the_key_and_pushes_through_the_menu(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    remote = served / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    root = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(root))
    git(root, "checkout", "-qb", "corral/s1")

    conv = new_conversation()
    # Count variables that look like a model key, and files in the workspace that hold one.
    snoop = "env | grep -ci -e sk-ant -e api_key; grep -rls sk-ant . ; echo snooped"
    commit = (
        "echo work > out.txt && git add out.txt && "
        "git -c user.name=a -c user.email=a@a commit -qm work && echo committed"
    )
    scripted.load(
        {
            "conversations": {
                conv: [
                    {"tool_use": {"name": "bash", "input": {"command": snoop}}},
                    {"tool_use": {"name": "bash", "input": {"command": commit}}},
                    {"tool_use": {"name": "mcp__corral__push", "input": {}}},
                    {"tool_use": {"name": "mcp__corral__push", "input": {"branch": "main"}}},
                    {"text": "all done"},
                ]
            }
        }
    )
    credential = tmp_path / "pod-credential"
    credential.write_text("pod-local-credential-0123456789\n")
    custodian_env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_STATE_DIR": str(tmp_path / "custodian-state"),
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
    }
    with (
        git_daemon(served) as daemon,
        running_custodian(
            custodian_env | {"CORRAL_GIT_REMOTE_URL": daemon + "remote.git"},
            tmp_path / "custodian.log",
        ) as custodian,
    ):
        harness = Harness(
            model_url=custodian.url,
            menu_url=custodian.url,
            state_dir=tmp_path / "harness-state",
            root=root,
            # The harness presents the pod-local credential: bearer to the Menu, api_key to
            # the model proxy.
            extra_env={"CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential)},
        )
        harness.start()
        try:
            admitted = harness.admit(conv, "go", spec=AGENT)
            settled = harness.wait_settled(conv, admitted["submissionId"], timeout=60)
            assert settled["status"] == "completed", settled
            events = harness.history(conv)
        finally:
            harness.stop()

    requests = scripted.requests(conv)
    assert len(requests) == 5
    # Upstream saw the custodian's key on every call; the harness's credential stopped there.
    assert {r["headers"]["x-api-key"] for r in requests} == {MODEL_KEY}
    assert "pod-local-credential" not in json.dumps([r["headers"] for r in requests])
    # The Menu the model saw came from the custodian.
    tool_names = {t["name"] for t in requests[0]["body"]["tools"]}
    assert "mcp__corral__push" in tool_names and "bash" in tool_names

    results = {e["toolUseId"]: e for e in events if e["type"] == "tool_end"}
    ordered = [results[e["toolUseId"]] for e in events if e["type"] == "tool_start"]
    snooped, committed, pushed, refused = (str(e["result"]) for e in ordered)
    assert snooped.split() == ["0", "snooped"], snooped
    assert "committed" in committed
    assert "pushed" in pushed and ordered[2]["isError"] is False
    assert git(remote, "rev-parse", "refs/heads/corral/s1") == git(root, "rev-parse", "HEAD")
    assert ordered[3]["isError"] is True and "'main'" in refused
    assert subprocess.run(
        ["git", "-C", str(remote), "rev-parse", "--verify", "-q", "refs/heads/main"],
        capture_output=True, check=False,
    ).returncode != 0  # fmt: skip
    assert MODEL_KEY not in json.dumps(events)


def test_an_abort_answers_at_once_while_a_model_call_waits_in_the_custodian(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    import time

    root = tmp_path / "workspace"
    root.mkdir()
    conv = new_conversation()
    slow = {"text": "slow", "delay": 30}
    scripted.load({"conversations": {conv: [slow, slow]}})
    credential = tmp_path / "pod-credential"
    credential.write_text("pod-local-credential-0123456789\n")
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_STATE_DIR": str(tmp_path / "custodian-state"),
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        harness = Harness(
            model_url=custodian.url,
            menu_url=custodian.url,
            state_dir=tmp_path / "harness-state",
            root=root,
            extra_env={"CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential)},
        )
        harness.start()
        try:
            # An abort that lands before the model call starts: the call must not start.
            early = harness.admit(conv, "go", spec=AGENT)
            started = time.monotonic()
            assert harness.abort(conv) is True
            assert time.monotonic() - started < 5
            assert harness.wait_settled(conv, early["submissionId"])["status"] == "aborted"
            # And one that lands while the call waits upstream: it is cut at once.
            before = len(scripted.requests(conv))
            admitted = harness.admit(conv, "go", spec=AGENT)
            deadline = time.monotonic() + 20
            while len(scripted.requests(conv)) == before:
                assert time.monotonic() < deadline, "the model call never reached upstream"
                time.sleep(0.05)
            started = time.monotonic()
            assert harness.abort(conv) is True
            assert time.monotonic() - started < 5
            settled = harness.wait_settled(conv, admitted["submissionId"], timeout=10)
            assert settled["status"] == "aborted"
        finally:
            harness.stop()
