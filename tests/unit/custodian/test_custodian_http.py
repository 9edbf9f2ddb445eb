"""The custodian as a real process: the model proxy against the project's scripted model,
driven by the official SDK the way the harness drives it, and the push tool against real git.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from corral_harness.scripted import ScriptedModel, parse_script, serve_in_thread

from ._custodian_proc import running_custodian

pytestmark = pytest.mark.timeout(60)

MODEL_KEY = "sk-ant-custodian-only-0123456789"
HARNESS_PLACEHOLDER = "harness-has-no-key"
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


@dataclass
class Upstream:
    """The scripted model standing in for api.anthropic.com, and its address."""

    model: ScriptedModel
    url: str

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.model.requests


@pytest.fixture
def scripted() -> Iterator[Upstream]:
    model = ScriptedModel(parse_script(SCRIPT))
    server = serve_in_thread(model)
    try:
        yield Upstream(model, server.url)
    finally:
        server.stop()


def sdk(url: str) -> anthropic.Anthropic:
    # The harness side: a placeholder key, the custodian as base URL.
    return anthropic.Anthropic(api_key=HARNESS_PLACEHOLDER, base_url=url, max_retries=2)


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
    scripted: Upstream, tmp_path: Path
) -> None:
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
    }
    with running_custodian(env, tmp_path / "custodian.log") as url:
        client = sdk(url)
        assert ask(client, "plain", stream=True) == "hello"
        assert ask(client, "plain", stream=False) == "again"

        seen = [r["headers"].get("x-api-key") for r in scripted.requests]
        assert seen == [MODEL_KEY, MODEL_KEY]
        assert all("authorization" not in r["headers"] for r in scripted.requests)

        # Nothing the harness side can read carries the key: not the answers, not /usage.
        raw = httpx.post(
            url + "/v1/messages",
            headers={"x-api-key": "attacker-supplied", "anthropic-version": "2023-06-01"},
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
        # The caller's own key was replaced, not forwarded alongside.
        assert scripted.requests[-1]["headers"]["x-api-key"] == MODEL_KEY
        usage = httpx.get(url + "/usage").json()
        assert MODEL_KEY not in json.dumps(usage)
        assert usage["usage"]["input"] == 3000 and usage["usage"]["output"] == 1500
        assert usage["usage"]["cost"] == pytest.approx(3 * (1000 * 1 + 500 * 5) / 1e6)

    records = (tmp_path / "state" / "usage.jsonl").read_text().splitlines()
    assert len(records) == 3


def test_the_budget_stops_requests_with_a_reason_and_survives_a_restart(
    scripted: Upstream, tmp_path: Path
) -> None:
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_BUDGET_TOKENS": "1200",
    }
    with running_custodian(env, tmp_path / "custodian.log") as url:
        client = sdk(url)
        ask(client, "plain", stream=True)  # 1500 tokens: the budget is now spent
        started = time.monotonic()
        with pytest.raises(anthropic.RateLimitError) as caught:
            ask(client, "plain", stream=True)
        # x-should-retry: false means the SDK gives up at once instead of backing off twice.
        assert time.monotonic() - started < 1.0
        assert "token budget" in str(caught.value) and "1500 of 1200" in str(caught.value)
        assert len(scripted.requests) == 1
    with running_custodian(env, tmp_path / "custodian.log") as url:
        response = httpx.post(url + "/v1/messages", json={"model": "m", "messages": []})
        assert response.status_code == 429
        assert response.json()["error"]["type"] == "budget_exceeded_error"
        assert len(scripted.requests) == 1


def test_streams_pass_through_as_they_arrive(scripted: Upstream, tmp_path: Path) -> None:
    env = {"CORRAL_UPSTREAM_URL": scripted.url}
    with running_custodian(env, tmp_path / "custodian.log") as url:
        started = time.monotonic()
        first_text_at = None
        with sdk(url).messages.stream(
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
    with running_custodian({}, tmp_path / "custodian.log") as url:
        bad_json = httpx.post(url + "/v1/messages", content=b"{nope")
        assert bad_json.status_code == 400 and "not JSON" in bad_json.text
        unknown = httpx.post(url + "/agents/c1/tools/rm_rf", json={})
        assert unknown.status_code == 404 and "rm_rf" in unknown.json()["reason"]
        not_object = httpx.post(url + "/agents/c1/tools/push", json=[1])
        assert not_object.status_code == 400 and "object" in not_object.json()["reason"]
        no_cluster = httpx.post(url + "/agents/c1/tools/spawn_child", json={"task": "t"})
        assert no_cluster.status_code == 200
        assert no_cluster.json()["isError"] is True
        assert "cluster" in no_cluster.json()["content"]


def test_upstream_errors_pass_through_and_cost_nothing(scripted: Upstream, tmp_path: Path) -> None:
    env = {"CORRAL_UPSTREAM_URL": scripted.url, "ANTHROPIC_API_KEY": MODEL_KEY}
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "overloaded"},
    }
    with running_custodian(env, tmp_path / "custodian.log") as url:
        answer = httpx.post(url + "/v1/messages", json=body)
        assert answer.status_code == 529
        assert answer.json()["error"]["type"] == "overloaded_error"
        assert httpx.get(url + "/usage").json()["usage"]["requests"] == 0
    # An upstream that is not there is a 502 that says so, and the SDK may retry it.
    dead = {"CORRAL_UPSTREAM_URL": "http://127.0.0.1:9"}
    with running_custodian(dead, tmp_path / "custodian.log") as url:
        answer = httpx.post(url + "/v1/messages", json=body)
        assert answer.status_code == 502
        assert "unreachable" in answer.json()["error"]["message"]
        assert answer.headers["x-should-retry"] == "true"


# ---------------------------------------------------------------------------------------- push


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t",
             "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"},
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    work = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    git(work, "checkout", "-q", "-b", "corral/s1")
    (work / "a.txt").write_text("one\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-q", "-m", "one")
    git(work, "push", "-q", "origin", "HEAD:main")
    return work, remote


def test_push_goes_to_the_sessions_branch_only_even_when_the_agent_rewires_git(
    repos: tuple[Path, Path], tmp_path: Path
) -> None:
    work, remote = repos
    env = {
        "CORRAL_WORKSPACE": str(work),
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
    }
    with running_custodian(env, tmp_path / "custodian.log") as url:
        tools = url + "/agents/c1/tools/"
        (work / "a.txt").write_text("two\n")
        git(work, "commit", "-qam", "two")
        head = git(work, "rev-parse", "HEAD")
        pushed = httpx.post(tools + "push", json={}, timeout=30).json()
        assert pushed["isError"] is False, pushed
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == head

        main_before = git(remote, "rev-parse", "refs/heads/main")
        for attack in ({"branch": "main"}, {"refspec": "+HEAD:main"}, {"force": True}):
            refused = httpx.post(tools + "push", json=attack, timeout=30).json()
            assert refused["isError"] is True, attack
        assert git(remote, "rev-parse", "refs/heads/main") == main_before

        # The agent owns the workspace's .git: it points origin elsewhere and adds a hook.
        evil = tmp_path / "evil.git"
        git(tmp_path, "init", "-q", "--bare", str(evil))
        hooks = work / ".git" / "evil-hooks"
        hooks.mkdir()
        marker = tmp_path / "hook-ran"
        (hooks / "pre-push").write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / "pre-push").chmod(0o755)
        git(work, "config", "core.hooksPath", str(hooks))
        git(work, "config", "remote.origin.url", str(evil))
        git(work, "config", f"url.{evil}.insteadOf", str(remote))
        (work / "a.txt").write_text("three\n")
        git(work, "commit", "-qam", "three")
        pushed = httpx.post(tools + "push", json={}, timeout=30).json()
        assert pushed["isError"] is False, pushed
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == git(work, "rev-parse", "HEAD")
        assert git(evil, "for-each-ref") == ""
        assert not marker.exists()

        # Rewritten history is not a fast-forward, and push never forces.
        git(work, "reset", "-q", "--hard", "HEAD~2")
        (work / "b.txt").write_text("rewrite\n")
        git(work, "add", "b.txt")
        git(work, "commit", "-qm", "rewrite")
        before = git(remote, "rev-parse", "refs/heads/corral/s1")
        rejected = httpx.post(tools + "push", json={}, timeout=30).json()
        assert rejected["isError"] is True
        assert git(remote, "rev-parse", "refs/heads/corral/s1") == before


def test_the_menu_without_a_cluster_offers_push_only(
    repos: tuple[Path, Path], tmp_path: Path
) -> None:
    work, _ = repos
    spec = json.dumps({"identity": "x", "model": "claude-haiku-4-5", "orchestrator": True})
    env = {
        "CORRAL_WORKSPACE": str(work),
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_AGENT_SPEC_JSON": spec,
    }
    with running_custodian(env, tmp_path / "custodian.log") as url:
        surface = httpx.get(url + "/agents/c1/surface").json()
        assert [t["name"] for t in surface["tools"]] == ["push"]
        assert surface["tools"][0]["input_schema"]["type"] == "object"
