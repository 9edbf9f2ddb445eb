"""The headline of long-term memory: a fact the model writes in one Session is recalled in a
second Session served by new harness and custodian processes (a new pod), on the request the
model gets, with its origin, and never in the second Session's transcript.

Real parts: the scripted model behind the real custodian's proxy, real `corral-harness`
processes talking to it with the pod-local credential, and the store on SQLite (`corral run`)
and on a real PostgreSQL server (a cluster).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests._scripted import ScriptedServer
from tests.unit.custodian._custodian_proc import running_custodian

from ._rig import Harness, new_conversation

pytestmark = pytest.mark.timeout(150)

AGENT: dict[str, Any] = {
    "identity": "You are a test agent.",
    "model": "corral-scripted",
    "tools": {"allow": ["bash", "mcp__corral__memory_*"]},
    "memory": {},  # on, scope = the Agent's name
}
FACT = "The release train leaves on Thursdays at 14:00 UTC."


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "sqlite":
        return {"CORRAL_MEMORY_SQLITE": str(tmp_path / "memory.db")}
    dsn_file = tmp_path / "memory-dsn"
    dsn_file.write_text(request.getfixturevalue("postgres").dsn)
    return {"CORRAL_MEMORY_DSN_FILE": str(dsn_file)}


def run_session(
    tmp_path: Path,
    upstream: str,
    store_env: dict[str, str],
    session: str,
    conv: str,
    message: str,
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """One Session in a fresh 'pod': its own custodian and harness processes, stopped after."""
    pod = tmp_path / session
    (pod / "root").mkdir(parents=True)
    credential = pod / "pod-credential"
    credential.write_text(f"pod-local-credential-{session}-0123456789\n")
    env = {
        "CORRAL_UPSTREAM_URL": upstream,
        "CORRAL_SESSION_NAME": session,
        "CORRAL_SESSION_NAMESPACE": "default",
        "CORRAL_AGENT_NAME": "agent",
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
        **store_env,
    }
    with running_custodian(env, pod / "custodian.log", operator=False) as custodian:
        harness = Harness(
            model_url=custodian.url,
            menu_url=custodian.url,
            state_dir=pod / "harness-state",
            root=pod / "root",
            extra_env={"CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential)},
        )
        harness.start()
        try:
            admitted = harness.admit(conv, message, spec=AGENT)
            settled = harness.wait_settled(conv, admitted["submissionId"], timeout=60)
            return settled, harness.history(conv), str(admitted["submissionId"])
        finally:
            harness.stop()


def test_a_fact_written_in_one_session_is_recalled_by_the_next(
    tmp_path: Path, scripted: ScriptedServer, store_env: dict[str, str]
) -> None:
    upstream = scripted.url
    first, second = new_conversation(), new_conversation()
    scripted.load(
        {
            "conversations": {
                first: [
                    {
                        "tool_use": {
                            "name": "mcp__corral__memory_add",
                            "input": {"subject": "release train", "text": FACT},
                        }
                    },
                    {"text": "Noted for next time."},
                ],
                second: [{"text": "Thursday, 14:00 UTC."}],
            }
        }
    )
    settled, events, submission = run_session(
        tmp_path, upstream, store_env, "s1", first, "Our release train leaves Thursdays 14:00."
    )
    assert settled["status"] == "completed", settled
    ends = [e for e in events if e["type"] == "tool_end"]
    assert len(ends) == 1 and ends[0]["isError"] is False, ends
    assert '"remembered"' in str(ends[0]["result"])
    first_tools = {t["name"] for t in scripted.requests()[0]["body"]["tools"]}
    assert "mcp__corral__memory_add" in first_tools

    settled, events, _ = run_session(
        tmp_path, upstream, store_env, "s2", second, "When does the release train leave?"
    )
    assert settled["status"] == "completed", settled
    asked = [r["body"] for r in scripted.requests(second)]
    assert len(asked) == 1
    system = asked[0]["system"]
    if isinstance(system, list):  # text blocks
        system = "\n".join(str(block.get("text", "")) for block in system)
    expected = (
        f"[memory #{_fact_id(ends[0]['result'])} via subject; from session s1 turn {submission}]"
        f" release train: {FACT}"
    )
    assert expected in system, system
    # Call-only: the recalled fact is in the request, not in the second Session's record.
    assert FACT not in json.dumps(events)
    assert FACT not in json.dumps(asked[0]["messages"])


def _fact_id(result: Any) -> int:
    return int(json.loads(str(result))["remembered"])
