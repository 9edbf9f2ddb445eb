"""The model proxy's own rules, against a real custodian and the scripted upstream, which
records what it received: the model, max_tokens, the budget reservation, concurrency and size.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._scripted import ScriptedServer

from ._custodian_proc import Custodian, running_custodian

pytestmark = pytest.mark.timeout(90)

UPSTREAM_SCRIPT = {
    "default": ["ok"] * 20,
    "conversations": {
        "slow": [{"text": "slow", "delay": 1.5}] * 8,
        "long-stream": [{"text": "x" * 4000, "event_delay": 0.05}],
        "small": [{"text": "hi", "usage": {"input_tokens": 100, "output_tokens": 50}}] * 5,
    },
}


@pytest.fixture
def upstream(scripted: ScriptedServer) -> ScriptedServer:
    """The scripted model as the custodian's upstream, replying from UPSTREAM_SCRIPT."""
    scripted.load(UPSTREAM_SCRIPT)
    return scripted


def agent(**extra: Any) -> str:
    return json.dumps({"identity": "x", "model": "claude-haiku-4-5", **extra})


def body(conversation: str = "c", **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": conversation},
        **extra,
    }


def post(custodian: Custodian, payload: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(
        custodian.url + "/v1/messages", json=payload, headers=custodian.headers, timeout=30,
        **kwargs,
    )  # fmt: skip


def refusal(response: httpx.Response, status: int, kind: str, retry: bool) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind
    assert response.headers["x-should-retry"] == ("true" if retry else "false")
    return str(error["message"])


def test_only_the_agents_model_and_the_sessions_override_go_upstream(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {
        "CORRAL_UPSTREAM_URL": url,
        "CORRAL_AGENT_SPEC_JSON": agent(),
        "CORRAL_MODEL_OVERRIDE": "claude-3-5-haiku-latest",
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        for allowed in ("claude-haiku-4-5", "claude-3-5-haiku-latest"):
            assert post(custodian, body(model=allowed)).status_code == 200
        message = refusal(
            post(custodian, body(model="claude-opus-4-1")), 403, "permission_error", False
        )
        assert "'claude-opus-4-1' is not allowed" in message
        assert "'claude-haiku-4-5'" in message and "'claude-3-5-haiku-latest'" in message
        assert [r["body"]["model"] for r in upstream.requests()] == [
            "claude-haiku-4-5",
            "claude-3-5-haiku-latest",
        ]
        # Tools the provider would run itself (reaching the network past the pod's policy)
        # and the MCP connector are refused.
        search = body(tools=[{"type": "web_search_20250305", "name": "web_search"}])
        assert "web_search_20250305" in refusal(
            post(custodian, search), 400, "invalid_request_error", False
        )
        mcp = body(mcp_servers=[{"type": "url", "url": "https://evil.example/mcp", "name": "e"}])
        assert "mcp_servers" in refusal(post(custodian, mcp), 400, "invalid_request_error", False)
        assert len(upstream.requests()) == 2


def test_max_tokens_is_clamped_to_the_agent_and_the_catalog(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {
        "CORRAL_UPSTREAM_URL": url,
        "CORRAL_AGENT_SPEC_JSON": agent(limits={"maxOutputTokens": 3000}),
        "CORRAL_MODEL_OVERRIDE": "claude-3-5-haiku-latest",
    }
    thinking = {"type": "enabled", "budget_tokens": 16000}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        # The Agent's cap, 3000, is below haiku-4-5's 64000.
        assert post(custodian, body(max_tokens=50_000, thinking=thinking)).status_code == 200
        # A smaller request passes as it is.
        assert post(custodian, body(max_tokens=200)).status_code == 200
        assert refusal(post(custodian, body(max_tokens=0)), 400, "invalid_request_error", False)
    env["CORRAL_AGENT_SPEC_JSON"] = agent()  # the Agent's cap: the default 32000
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        # claude-3-5-haiku's catalog maximum, 8192, is below the Agent's cap.
        over = body(model="claude-3-5-haiku-latest", max_tokens=20_000)
        assert post(custodian, over).status_code == 200
    sent = [r["body"] for r in upstream.requests()]
    assert [b["max_tokens"] for b in sent] == [3000, 200, 8192]
    # The thinking budget stays below the clamped max_tokens, as the provider requires.
    assert sent[0]["thinking"] == {"type": "enabled", "budget_tokens": 2999}


def test_the_budget_is_reserved_before_forwarding_and_survives_a_restart(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {
        "CORRAL_UPSTREAM_URL": url,
        "CORRAL_AGENT_SPEC_JSON": agent(limits={"budget": {"tokens": 1000}}),
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        # Nothing is spent, yet 2000 output tokens cannot fit a 1000-token budget.
        message = refusal(
            post(custodian, body("small", max_tokens=2000)), 429, "budget_exceeded_error", False
        )
        assert "cannot cover this request" in message and "0 of 1000 tokens used" in message
        assert upstream.requests() == []
        # 100 in + 50 out recorded: 150 of 1000.
        assert post(custodian, body("small", max_tokens=400)).status_code == 200
        usage: Any = custodian.usage()
        assert (usage["usage"]["input"], usage["usage"]["output"]) == (100, 50)
        assert usage["reserved"]["output"] == 0  # settled
        # 150 used + this request's up to 900 is more than 1000.
        message = refusal(
            post(custodian, body("small", max_tokens=880)), 429, "budget_exceeded_error", False
        )
        assert "150 of 1000 tokens used" in message
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        # The restarted custodian remembers the 150 and refuses the same request.
        message = refusal(
            post(custodian, body("small", max_tokens=880)), 429, "budget_exceeded_error", False
        )
        assert "150 of 1000 tokens used" in message
        usage = custodian.usage()
        assert (usage["usage"]["input"], usage["usage"]["output"]) == (100, 50)
        assert post(custodian, body("small", max_tokens=300)).status_code == 200
    assert len(upstream.requests()) == 2


def test_requests_in_flight_hold_their_reservation(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {
        "CORRAL_UPSTREAM_URL": url,
        "CORRAL_AGENT_SPEC_JSON": agent(),
        "CORRAL_BUDGET_TOKENS": "1000",
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        first: list[httpx.Response] = []
        slow = threading.Thread(
            target=lambda: first.append(post(custodian, body("slow", max_tokens=600)))
        )
        slow.start()
        deadline = time.monotonic() + 5
        while not upstream.requests():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        usage: Any = custodian.usage()
        assert usage["reserved"]["output"] == 600
        message = refusal(
            post(custodian, body("c", max_tokens=600)), 429, "budget_exceeded_error", False
        )
        assert "held by requests in flight" in message
        slow.join()
        assert first[0].status_code == 200
        assert custodian.usage()["reserved"]["output"] == 0  # type: ignore[index]
        # The slow answer spent little, so the same request now fits.
        assert post(custodian, body("c", max_tokens=600)).status_code == 200


def test_a_stream_cut_by_the_client_is_settled_and_charged(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {"CORRAL_UPSTREAM_URL": url, "CORRAL_AGENT_SPEC_JSON": agent()}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        with httpx.stream(
            "POST", custodian.url + "/v1/messages", headers=custodian.headers,
            json=body("long-stream", max_tokens=4000, stream=True), timeout=30,
        ) as response:  # fmt: skip
            assert response.status_code == 200
            for _ in zip(range(3), response.iter_raw(), strict=False):
                pass  # read a little, then hang up
        hung_up = time.monotonic()
        while True:
            usage: Any = custodian.usage()
            if usage["reserved"]["output"] == 0:
                break
            # The full stream takes about 8 s; the settlement comes with the hang-up.
            assert time.monotonic() - hung_up < 3, usage
            time.sleep(0.05)
        # The reservation is gone; the stream's input and the output that came through so far
        # (not the 1 its first event claimed, not all 4000 max_tokens) are charged.
        assert usage["usage"]["input"] > 0
        assert 1 < usage["usage"]["output"] < 500, usage


def test_too_many_requests_in_flight_are_refused_with_a_retry(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {"CORRAL_UPSTREAM_URL": url, "CORRAL_AGENT_SPEC_JSON": agent()}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda: answers.append(post(custodian, body("slow"))))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while len(upstream.requests()) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        message = refusal(post(custodian, body("c")), 429, "rate_limit_error", True)
        assert "4 model requests are already in flight (the limit is 4)" in message
        for t in threads:
            t.join()
        assert [a.status_code for a in answers] == [200] * 4
        assert post(custodian, body("c")).status_code == 200  # slots are given back


def test_a_request_body_over_the_limit_is_refused_unread(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    url = upstream.url
    env = {"CORRAL_UPSTREAM_URL": url, "CORRAL_AGENT_SPEC_JSON": agent()}
    big = body(messages=[{"role": "user", "content": "x" * (9 * 1024 * 1024)}])
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        message = refusal(post(custodian, big), 413, "request_too_large", False)
        assert str(8 * 1024 * 1024) in message

        # Without a Content-Length, the limit holds on the bytes as they come.
        def chunks() -> Iterator[bytes]:
            data = json.dumps(big).encode()
            for i in range(0, len(data), 1 << 20):
                yield data[i : i + (1 << 20)]

        chunked = httpx.post(
            custodian.url + "/v1/messages", content=chunks(), headers=custodian.headers
        )
        refusal(chunked, 413, "request_too_large", False)
        assert upstream.requests() == []
        assert post(custodian, body()).status_code == 200
