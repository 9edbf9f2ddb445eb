"""The custodian as a real process: the model proxy against the project's scripted model,
driven by the official SDK the way the harness drives it (its api_key is the pod-local
credential), and the push tool against real git over a git daemon.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests._scripted import ScriptedServer

from ._bundle_rig import send_head
from ._custodian_proc import Custodian, git, git_daemon, running_custodian

pytestmark = pytest.mark.timeout(60)

MODEL_KEY = "sk-ant-custodian-only-0123456789"
AGENT = {"identity": "x", "model": "claude-haiku-4-5", "tools": {"allow": ["mcp__corral__*"]}}
AGENT_JSON = json.dumps(AGENT)
SCRIPT = {
    "conversations": {
        "plain": [
            {"text": "hello", "usage": {"input_tokens": 1000, "output_tokens": 500}},
            {"text": "again", "usage": {"input_tokens": 1000, "output_tokens": 500}},
            {"text": "third", "usage": {"input_tokens": 1000, "output_tokens": 500}},
        ],
        "slow": [{"text": "x" * 200, "event_delay": 0.15}],
        "overloaded": [{"fault": {"status": 529, "type": "overloaded_error"}}],
    }
}


def sdk(custodian: Custodian) -> anthropic.Anthropic:
    # The harness side: the pod-local credential as its api_key, the custodian as base URL.
    return anthropic.Anthropic(api_key=custodian.credential, base_url=custodian.url, max_retries=2)


def ask(client: anthropic.Anthropic, conversation: str, *, stream: bool) -> str:
    params = {
        "model": "claude-haiku-4-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": conversation},
    }
    if stream:
        with client.messages.stream(**params) as s:  # type: ignore[arg-type]
            return s.get_final_text()
    message = client.messages.create(**params)  # type: ignore[call-overload]
    return "".join(b.text for b in message.content if b.type == "text")


def test_the_key_is_added_upstream_and_never_reaches_the_harness(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    scripted.load(SCRIPT)  # the scripted model stands in for api.anthropic.com
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_AGENT_SPEC_JSON": AGENT_JSON,
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        client = sdk(custodian)
        assert ask(client, "plain", stream=True) == "hello"
        assert ask(client, "plain", stream=False) == "again"

        seen = [r["headers"].get("x-api-key") for r in scripted.requests()]
        assert seen == [MODEL_KEY, MODEL_KEY]
        assert all("authorization" not in r["headers"] for r in scripted.requests())

        # Nothing the harness side can read carries the key: not the answers, not the usage;
        # and the credential it presents goes no further than the custodian.
        raw = httpx.post(
            custodian.url + "/v1/messages",
            headers={**custodian.headers, "anthropic-version": "2023-06-01"},
            json={
                "model": "claude-haiku-4-5",
                "max_tokens": 10,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": {"user_id": "plain"},
            },
        )
        assert raw.status_code == 200
        assert MODEL_KEY not in raw.text and MODEL_KEY not in str(raw.headers)
        # The caller's own credential was replaced, not forwarded alongside.
        assert scripted.requests()[-1]["headers"]["x-api-key"] == MODEL_KEY
        sent = scripted.requests()
        assert all(custodian.credential not in json.dumps(r["headers"]) for r in sent)
        usage: Any = custodian.usage()
        assert MODEL_KEY not in json.dumps(usage)
        assert usage["usage"]["input"] == 3000 and usage["usage"]["output"] == 1500
        assert usage["usage"]["cost"] == pytest.approx(3 * (1000 * 1 + 500 * 5) / 1e6)
        # The harness-facing port no longer serves the usage record.
        assert httpx.get(custodian.url + "/usage", headers=custodian.headers).status_code == 404

    records = (tmp_path / "state" / "usage.jsonl").read_text().splitlines()
    assert len(records) == 3


def test_the_budget_stops_requests_with_a_reason_and_survives_a_restart(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    scripted.load(SCRIPT)
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_BUDGET_TOKENS": "1200",
        "CORRAL_AGENT_SPEC_JSON": AGENT_JSON,
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        client = sdk(custodian)
        ask(client, "plain", stream=True)  # 1500 tokens: the budget is now spent
        started = time.monotonic()
        with pytest.raises(anthropic.RateLimitError) as caught:
            ask(client, "plain", stream=True)
        # x-should-retry: false means the SDK gives up at once instead of backing off twice.
        assert time.monotonic() - started < 1.0
        assert "token budget" in str(caught.value) and "1500 of 1200" in str(caught.value)
        assert len(scripted.requests()) == 1
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        response = httpx.post(
            custodian.url + "/v1/messages",
            headers=custodian.headers,
            json={"model": "claude-haiku-4-5", "max_tokens": 1, "messages": []},
        )
        assert response.status_code == 429
        assert response.json()["error"]["type"] == "budget_exceeded_error"
        assert "1500 of 1200" in response.json()["error"]["message"]
        assert len(scripted.requests()) == 1
        usage: Any = custodian.usage()
        assert usage["exceeded"] is True and "1500 of 1200" in usage["reason"]
        assert usage["budget"]["tokens"] == 1200


def test_streams_pass_through_as_they_arrive(scripted: ScriptedServer, tmp_path: Path) -> None:
    scripted.load(SCRIPT)
    env = {"CORRAL_UPSTREAM_URL": scripted.url, "CORRAL_AGENT_SPEC_JSON": AGENT_JSON}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        started = time.monotonic()
        first_text_at = None
        with sdk(custodian).messages.stream(
            model="claude-haiku-4-5",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            metadata={"user_id": "slow"},
        ) as stream:
            for event in stream:
                if event.type == "text" and first_text_at is None:
                    first_text_at = time.monotonic() - started
        total = time.monotonic() - started
    assert first_text_at is not None
    # A buffering proxy would deliver the first text only at the end of the slow stream.
    assert total - first_text_at > 0.5


def test_bad_requests_get_4xx_with_a_reason(tmp_path: Path) -> None:
    env = {"CORRAL_AGENT_SPEC_JSON": AGENT_JSON}
    with running_custodian(env, tmp_path / "custodian.log") as custodian, custodian.client() as c:
        bad_json = c.post("/v1/messages", content=b"{nope")
        assert bad_json.status_code == 400 and "not JSON" in bad_json.text
        unknown = c.post("/agents/c1/tools/rm_rf", json={})
        assert unknown.status_code == 404 and "rm_rf" in unknown.json()["reason"]
        not_object = c.post("/agents/c1/tools/push", json=[1])
        assert not_object.status_code == 400 and "object" in not_object.json()["reason"]
        no_cluster = c.post("/agents/c1/tools/spawn_child", json={"task": "t"})
        assert no_cluster.status_code == 200
        assert no_cluster.json()["isError"] is True
        assert "cluster" in no_cluster.json()["content"]


def test_upstream_errors_pass_through_and_cost_nothing(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    scripted.load(SCRIPT)
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_AGENT_SPEC_JSON": AGENT_JSON,
    }
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "overloaded"},
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        answer = httpx.post(custodian.url + "/v1/messages", json=body, headers=custodian.headers)
        assert answer.status_code == 529
        assert answer.json()["error"]["type"] == "overloaded_error"
        usage: Any = custodian.usage()
        assert usage["usage"]["input"] == 0 and usage["reserved"]["output"] == 0
    # An upstream that is not there is a 502 that says so, and the SDK may retry it.
    dead = {"CORRAL_UPSTREAM_URL": "http://127.0.0.1:9", "CORRAL_AGENT_SPEC_JSON": AGENT_JSON}
    with running_custodian(dead, tmp_path / "custodian.log") as custodian:
        answer = httpx.post(custodian.url + "/v1/messages", json=body, headers=custodian.headers)
        assert answer.status_code == 502
        assert "unreachable" in answer.json()["error"]["message"]
        assert answer.headers["x-should-retry"] == "true"


# ---------------------------------------------------------------------------------------- push


@pytest.fixture
def repos(tmp_path: Path) -> Iterator[tuple[Path, Path, str]]:
    """A workspace cloned from a bare repository served by git daemon, and its git:// URL."""
    served = tmp_path / "served"
    served.mkdir()
    remote = served / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    work = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    git(work, "checkout", "-q", "-b", "corral/s1")
    (work / "a.txt").write_text("one\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-q", "-m", "one")
    git(work, "push", "-q", "origin", "HEAD:main")
    with git_daemon(served) as base:
        yield work, remote, base + "remote.git"


def test_push_goes_to_the_sessions_branch_only_even_when_the_agent_rewires_git(
    repos: tuple[Path, Path, str], tmp_path: Path
) -> None:
    work, remote, url = repos
    env = {
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_GIT_REMOTE_URL": url,
        "CORRAL_AGENT_SPEC_JSON": AGENT_JSON,
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian, custodian.client() as c:
        (work / "a.txt").write_text("two\n")
        git(work, "commit", "-qam", "two")
        head = send_head(custodian.url, custodian.headers, work)  # as the harness does
        pushed = c.post("/agents/c1/tools/push", json={}).json()
        assert pushed == {"content": f"pushed {head} to corral/s1", "isError": False,
                          "endsTurn": False}  # fmt: skip
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == head

        main_before = git(remote, "rev-parse", "refs/heads/main")
        for attack in ({"branch": "main"}, {"refspec": "+HEAD:main"}, {"force": True}):
            refused = c.post("/agents/c1/tools/push", json=attack).json()
            assert refused["isError"] is True, attack
        assert git(remote, "rev-parse", "refs/heads/main") == main_before

        # The agent owns the workspace's .git: it points origin elsewhere, adds an insteadOf
        # for the real remote, and a pre-push hook. The custodian never reads any of it: it
        # takes the commits as a bundle.
        evil = tmp_path / "served" / "evil.git"
        git(tmp_path, "init", "-q", "--bare", str(evil))
        (work / "a.txt").write_text("three\n")
        git(work, "commit", "-qam", "three")
        hooks = work / ".git" / "evil-hooks"
        hooks.mkdir()
        marker = tmp_path / "hook-ran"
        (hooks / "pre-push").write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / "pre-push").chmod(0o755)
        git(work, "config", "core.hooksPath", str(hooks))
        git(work, "config", "remote.origin.url", str(evil))
        git(work, "config", f"url.{evil}.insteadOf", url)
        send_head(custodian.url, custodian.headers, work)
        pushed = c.post("/agents/c1/tools/push", json={}).json()
        assert pushed["isError"] is False, pushed
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == git(work, "rev-parse", "HEAD")
        assert git(evil, "for-each-ref") == ""
        assert not marker.exists()

    # A restarted custodian still pushes where CORRAL_GIT_REMOTE_URL says, not to origin.
    with running_custodian(env, tmp_path / "custodian.log") as custodian, custodian.client() as c:
        (work / "b.txt").write_text("four\n")
        git(work, "-c", f"core.hooksPath={os.devnull}", "add", "b.txt")
        git(work, "-c", f"core.hooksPath={os.devnull}", "commit", "-qm", "four")
        send_head(custodian.url, custodian.headers, work)
        pushed = c.post("/agents/c1/tools/push", json={}).json()
        assert pushed["isError"] is False, pushed
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == git(work, "rev-parse", "HEAD")
        assert git(evil, "for-each-ref") == "" and not marker.exists()

        # Rewritten history is not a fast-forward, and push never forces.
        git(work, "reset", "-q", "--hard", "HEAD~2")
        (work / "c.txt").write_text("rewrite\n")
        git(work, "-c", f"core.hooksPath={os.devnull}", "add", "c.txt")
        git(work, "-c", f"core.hooksPath={os.devnull}", "commit", "-qm", "rewrite")
        before = git(remote, "rev-parse", "refs/heads/corral/s1")
        send_head(custodian.url, custodian.headers, work)
        rejected = c.post("/agents/c1/tools/push", json={}).json()
        assert rejected["isError"] is True
        assert "non_fast_forward" in rejected["content"]
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == before


def test_the_menu_without_a_cluster_offers_push_only(
    repos: tuple[Path, Path, str], tmp_path: Path
) -> None:
    _, _, url = repos
    spec = json.dumps(
        {
            "identity": "x",
            "model": "claude-haiku-4-5",
            "orchestrator": True,
            "tools": {"allow": ["*"]},
        }
    )
    env = {
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_AGENT_SPEC_JSON": spec,
        "CORRAL_GIT_REMOTE_URL": url,
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian, custodian.client() as c:
        surface = c.get("/agents/c1/surface").json()
        assert [t["name"] for t in surface["tools"]] == ["push"]
        assert surface["tools"][0]["input_schema"]["type"] == "object"


def test_menu_tools_are_refused_by_the_agents_allow_and_deny(
    repos: tuple[Path, Path, str], tmp_path: Path
) -> None:
    work, remote, url = repos
    spec_file = tmp_path / "agent.json"
    spec_file.write_text(json.dumps({**AGENT, "tools": {"allow": ["bash", "read"]}}))
    env = {
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_AGENT_SPEC_FILE": str(spec_file),
        "CORRAL_GIT_REMOTE_URL": url,
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian, custodian.client() as c:
        assert c.get("/agents/c1/surface").json() == {"tools": []}
        refused = c.post("/agents/c1/tools/push", json={}).json()
        assert refused["isError"] is True
        assert refused["content"] == "mcp__corral__push is not in the Agent's tools.allow"
        # A model's own request_approval is held to the list; the harness's gate is not
        # (here it then needs the cluster, which this custodian does not have).
        own = c.post("/agents/c1/tools/request_approval", json={"tool": "bash"}).json()
        assert "tools.allow" in own["content"]
        gate = c.post(
            "/agents/c1/tools/request_approval",
            json={"tool": "bash"},
            headers={"X-Corral-Approval-Gate": "1"},
        ).json()
        assert gate["isError"] is True and "needs the cluster" in gate["content"]

        # The Agent is read afresh: deny beats a wildcard allow from the next call on.
        spec_file.write_text(
            json.dumps({**AGENT, "tools": {"allow": ["mcp__corral__*"], "deny": ["push"]}})
        )
        refused = c.post("/agents/c1/tools/push", json={}).json()
        assert refused["content"] == "mcp__corral__push is denied by the Agent's tools.deny"
        assert git(remote, "for-each-ref", "refs/heads/corral") == ""
        spec_file.write_text(json.dumps({**AGENT, "tools": {"allow": ["push"]}}))
        send_head(custodian.url, custodian.headers, work)
        assert c.post("/agents/c1/tools/push", json={}).json()["isError"] is False
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == git(work, "rev-parse", "HEAD")
