"""`corral get` tables, `corral tree` nesting and `corral describe`'s receipts, pure."""

from __future__ import annotations

from corral_cli._tables import rows
from corral_cli.describe_cmd import receipt_lines, render
from corral_cli.tree_cmd import nest


def _session(name: str, parent: str | None = None, **status: object) -> dict[str, object]:
    spec: dict[str, object] = {"agentRef": "coder"}
    if parent:
        spec["parentRef"] = {"name": parent}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status}


def test_session_rows_are_kubectl_shaped() -> None:
    items = [_session("b", phase="Running", turns=2, usage={"cost": 0.5}), _session("a")]
    table = rows("Session", items, 0.0, wide=True, namespaces=True)
    assert table[0][:3] == ["NAMESPACE", "NAME", "AGENT"] and table[0][-1] == "AGE"
    assert [r[1] for r in table[1:]] == ["a", "b"]
    assert table[2][2:10] == ["coder", "Running", "2", "", "", "", "0.5", ""]
    assert table[1][3] == ""  # no phase yet: an empty cell, as kubectl shows the column


def test_a_tree_nests_by_parent_and_survives_a_cycle() -> None:
    sessions = [_session("r"), _session("c1", "r"), _session("c2", "r"), _session("g", "c2"),
                _session("x", "x")]  # fmt: skip
    tree = nest(sessions[0], sessions)
    assert [c["name"] for c in tree["children"]] == ["c1", "c2"]
    assert tree["children"][1]["children"][0]["name"] == "g"
    assert nest(sessions[4], sessions)["children"] == []


def test_receipt_lines_name_status_error_and_tools() -> None:
    lines = receipt_lines([
        {"settlement": 1, "status": "failed", "error": {"type": "runaway", "message": "cap"},
         "usage": {"input": 3, "output": 1, "cost": 0.25},
         "receipt": {"outcome": "partial", "route": "reactive", "toolsRun": ["bash", "read"],
                     "phasePath": ["execute", "failed"]}},
    ])  # fmt: skip
    assert lines[0] == "1. failed (runaway: cap)  tokens in 3 out 1  $0.2500"
    assert "ledger: partial via reactive" in lines[1] and lines[-1] == "   tools: bash, read"


def test_describe_shows_the_gateways_decisions() -> None:
    session = {
        "metadata": {"name": "s1", "namespace": "team"},
        "spec": {"agentRef": "coder", "task": "t"},
        "status": {
            "phase": "Running",
            "egress": {
                "allowed": 3,
                "denied": 1,
                "moreHosts": 2,
                "observedAt": "2026-12-02T10:00:00Z",
                "hosts": [
                    {
                        "host": "evil.example",
                        "port": 443,
                        "identity": "agent",
                        "decision": "denied",
                        "reason": "not allowed for agent coder",
                        "count": 1,
                    },
                    {"host": "pypi.org", "port": 443, "identity": "agent",
                     "decision": "allowed", "count": 3, "bytesUp": 5, "bytesDown": 900},
                ],
            },
        },
    }  # fmt: skip
    text = render(session, [], [], None, "no receipts", 0.0)
    section = text.split("Egress:\n", 1)[1].split("Children:", 1)[0]
    assert "3 allowed, 1 denied (as of 2026-12-02T10:00:00Z)" in section
    assert "denied     agent   evil.example:443" in section
    assert "not allowed for agent coder" in section
    assert "5/900" in section and "and 2 more destinations" in section
    assert "Egress:" not in render({**session, "status": {}}, [], [], None, "", 0.0)
