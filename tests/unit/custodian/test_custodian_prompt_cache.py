"""Prompt caching through the custodian (docs/performance.md, "Prompt caching"): the real
harness behind the real custodian, the scripted model upstream. The markers the harness puts on
a request's stable prefixes survive the custodian's own serialisation of what it checked, and
the custodian's usage record, which is the Session's `status.usage` in a cluster, counts the
cache reads and writes the model billed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral_api.wire import CustodianUsage
from corral_operator.custodianclient import status_usage
from tests._scripted import ScriptedServer, marked_paths, unmarked
from tests.wire._rig import Harness, new_conversation

from ._custodian_proc import running_custodian

pytestmark = pytest.mark.timeout(90)

MARK = {"type": "ephemeral"}
AGENT = {
    "identity": "You are a test agent.",
    "instructions": "Be brief.",
    "model": "corral-scripted",
    "tools": {"allow": ["bash"]},
}


def test_the_markers_reach_the_model_and_the_custodian_counts_the_cache(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "AGENTS.md").write_text("ROOT-RULE: keep diffs small\n")
    conv = new_conversation()
    steps = [{"tool_use": {"name": "bash", "input": {"command": "echo step"}}}, "done"]
    scripted.load({"conversations": {conv: steps}})
    credential = tmp_path / "pod-credential"
    credential.write_text("pod-local-credential-0123456789\n")
    env = {
        "CORRAL_UPSTREAM_URL": scripted.url,
        "ANTHROPIC_API_KEY": "sk-ant-only-in-the-custodian",
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
            admitted = harness.admit(conv, "run a step", spec=AGENT)
            settled = harness.wait_settled(conv, admitted["submissionId"], timeout=60)
            record = CustodianUsage.model_validate(custodian.usage())
        finally:
            harness.stop()
    assert settled["status"] == "completed", settled

    first, second = scripted.requests(conv)
    body = second["body"]
    # Upstream got the custodian's serialisation with every marker where the harness put it:
    # the last tool, the identity, the instruction files, the conversation's last block.
    assert marked_paths(body) == [
        f"tools[{len(body['tools']) - 1}]",
        "system[0]",
        "system[1]",
        f"messages[{len(body['messages']) - 1}].content[0]",
    ]
    assert body["tools"][-1]["cache_control"] == MARK
    assert body["system"][0] == {
        "type": "text",
        "text": "<identity>\nYou are a test agent.\n</identity>",
        "cache_control": MARK,
    }
    assert body["system"][1]["cache_control"] == MARK and "ROOT-RULE" in body["system"][1]["text"]
    assert body["messages"][-1]["content"][0]["cache_control"] == MARK
    # The prompt itself went through as the harness sent it, markers aside.
    assert unmarked(body["messages"][:1]) == [
        {"role": "user", "content": [{"type": "text", "text": "run a step"}]}
    ]

    billed_read = sum(r["usage"]["cache_read_input_tokens"] for r in (first, second))
    billed_write = sum(r["usage"]["cache_creation_input_tokens"] for r in (first, second))
    assert billed_read == second["usage"]["cache_read_input_tokens"] > 0 and billed_write > 0
    # The custodian's record (what the operator writes to status.usage) and the harness's
    # settlement both carry the cache's reads and writes.
    status = status_usage(record)
    assert (status.cache_read_tokens, status.cache_write_tokens) == (billed_read, billed_write)
    assert (settled["usage"]["cacheRead"], settled["usage"]["cacheWrite"]) == (
        billed_read,
        billed_write,
    )
