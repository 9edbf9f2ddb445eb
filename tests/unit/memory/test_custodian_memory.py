"""Memory through the real custodian process: the scope is the custodian's (its Session's
namespace + the Agent's scope), whatever a caller sends; the memory tools pass the Agent's
allow/deny like every Menu tool; extraction after a turn; origins on every recalled fact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._postgres import Postgres
from tests.unit.custodian._custodian_proc import Custodian, running_custodian

pytestmark = pytest.mark.timeout(120)

AGENT: dict[str, Any] = {
    "identity": "You are a test agent.",
    "model": "corral-scripted",
    "tools": {"allow": ["mcp__corral__memory_*"], "deny": ["mcp__corral__memory_delete"]},
    "memory": {"scope": "shared-team", "extractAfterTurn": True},
}


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """One store both namespaces' custodians use, as in a cluster with one database."""
    if request.param == "sqlite":
        return {"CORRAL_MEMORY_SQLITE": str(tmp_path / "memory.db")}
    server: Postgres = request.getfixturevalue("postgres")
    dsn_file = tmp_path / "memory-dsn"
    dsn_file.write_text(server.dsn + "\n")
    return {"CORRAL_MEMORY_DSN_FILE": str(dsn_file)}


@contextmanager
def custodian(
    tmp_path: Path, store_env: dict[str, str], namespace: str, session: str, agent: Any = None
) -> Iterator[Custodian]:
    env = {
        "CORRAL_SESSION_NAME": session,
        "CORRAL_SESSION_NAMESPACE": namespace,
        "CORRAL_AGENT_NAME": "helper",
        "CORRAL_AGENT_SPEC_JSON": json.dumps(agent or AGENT),
        **store_env,
    }
    with running_custodian(env, tmp_path / f"{namespace}-{session}.log", operator=False) as c:
        yield c


def tool(c: httpx.Client, name: str, body: dict[str, Any], submission: str = "sub-1") -> Any:
    response = c.post(
        f"/agents/conv/tools/{name}", json=body, headers={"X-Corral-Submission": submission}
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def sqlite_env(tmp_path: Path) -> dict[str, str]:
    """For what does not depend on the backend (the conformance suite covers both)."""
    return {"CORRAL_MEMORY_SQLITE": str(tmp_path / "memory.db")}


def recall(c: httpx.Client, query: str, **extra: Any) -> httpx.Response:
    return c.post("/memory/recall", json={"query": query, **extra})


def test_a_namespace_cannot_reach_another_namespaces_memory(
    tmp_path: Path, store_env: dict[str, str]
) -> None:
    with ExitStack() as stack:
        a = stack.enter_context(custodian(tmp_path, store_env, "team-a", "s-a"))
        b = stack.enter_context(custodian(tmp_path, store_env, "team-b", "s-b"))
        ca, cb = stack.enter_context(a.client()), stack.enter_context(b.client())

        added = tool(ca, "memory_add", {"subject": "deploy", "text": "Deploy with make ship."})
        assert added["isError"] is False, added
        fid = json.loads(added["content"])["remembered"]

        # Same Agent name, same spec.memory.scope, same database: another namespace sees nothing.
        assert recall(cb, "how do I deploy").json()["facts"] == []
        # A harness that names a scope is refused, not obeyed.
        crafted = recall(cb, "how do I deploy", scope="team-a/shared-team")
        assert crafted.status_code == 400 and crafted.json()["error"] == "bad_input"
        assert "scope" in crafted.json()["reason"]
        smuggled = tool(cb, "memory_add", {"subject": "x", "text": "y", "scope": "team-a/x"})
        assert smuggled["isError"] is True and "scope" in smuggled["content"]
        # Ids are global in the database; another namespace's id reads as absent.
        hijack = tool(cb, "memory_rewrite", {"id": fid, "text": "Deploy with rm -rf /."})
        assert hijack["isError"] is True and hijack["content"] == f"no fact {fid}", hijack
        assert "team-a" not in hijack["content"]
        # A subject that spells another namespace's scope is just a subject of team-b's own.
        tool(cb, "memory_add", {"subject": "team-a/shared-team deploy", "text": "Not A's."})
        assert [f["text"] for f in recall(ca, "deploy").json()["facts"]] == [
            "Deploy with make ship."
        ]

        hits = recall(ca, "how do I deploy").json()
        assert hits["facts"][0]["origin"] == {"session": "s-a", "turn": "sub-1"}
        assert hits["lines"] == [
            f"[memory #{fid} via subject; from session s-a turn sub-1] deploy: "
            "Deploy with make ship."
        ]


def test_the_tools_follow_the_agents_allow_and_deny(
    tmp_path: Path, sqlite_env: dict[str, str]
) -> None:
    store_env = sqlite_env
    no_memory = {k: v for k, v in AGENT.items() if k != "memory"}
    with ExitStack() as stack:
        c = stack.enter_context(
            stack.enter_context(custodian(tmp_path, store_env, "ns", "s1")).client()
        )
        off = stack.enter_context(
            stack.enter_context(custodian(tmp_path, store_env, "ns", "s2", no_memory)).client()
        )
        names = {t["name"] for t in c.get("/agents/conv/surface").json()["tools"]}
        assert names == {"memory_add", "memory_rewrite", "memory_link"}  # delete is denied
        first = json.loads(tool(c, "memory_add", {"subject": "api", "text": "v2"})["content"])
        denied = tool(c, "memory_delete", {"id": first["remembered"]})
        assert denied["isError"] and "tools.deny" in denied["content"]
        linked = tool(c, "memory_link", {"a": "api", "b": "sdk"})
        assert linked["isError"] is False
        assert recall(c, "what about the sdk").json()["facts"][0]["via"] == "link"
        bad = tool(c, "memory_rewrite", {"id": "1; DROP TABLE facts", "text": "x"})
        assert bad["isError"] and "whole number" in bad["content"]

        # An Agent without spec.memory: no tools on the Menu, recall answers nothing.
        assert off.get("/agents/conv/surface").json()["tools"] == []
        assert recall(off, "api").json() == {"enabled": False, "facts": [], "lines": []}
        refused = tool(off, "memory_add", {"subject": "a", "text": "b"})
        assert refused["isError"] is True
        # Unauthenticated callers get nothing.
        assert (
            httpx.post(c.base_url.join("/memory/recall"), json={"query": "api"}).status_code == 401
        )


def test_extraction_after_a_turn_stores_remember_lines(
    tmp_path: Path, sqlite_env: dict[str, str]
) -> None:
    store_env = sqlite_env
    answer = (
        "Done: the build works.\n"
        "Remember: build: run `make test` before pushing.\n"
        "- remember: flaky test: test_network retries twice\n"
        "Remember this for later: not a fact line\n"
    )
    with custodian(tmp_path, store_env, "ns", "s1") as cust, cust.client() as c:
        first = c.post(
            "/memory/extract", json={"text": answer}, headers={"X-Corral-Submission": "t7"}
        )
        assert first.status_code == 200 and len(first.json()["added"]) == 2, first.text
        # The same answer again adds nothing new.
        again = c.post("/memory/extract", json={"text": answer})
        assert again.json()["added"] == []
        lines = recall(c, "the build is flaky").json()["lines"]
        assert any("from session s1 turn t7] build: run `make test`" in line for line in lines)
        assert c.post("/memory/extract", json={"text": 3}).status_code == 400
