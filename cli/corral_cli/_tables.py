"""The tables of `corral get` (kubectl's shape: upper-case headers, AGE last, NAMESPACE first
with -A, more columns with `-o wide`). Pure: objects in, rows out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._cluster import age

Obj = dict[str, Any]
Row = list[str]

# The word a person types -> (kind, plural). Short names as the CRDs declare them.
KINDS: dict[str, tuple[str, str]] = {}
for _kind, _plural, _aliases in (
    ("Session", "sessions", ("session", "sessions", "sess", "cs")),
    ("Goal", "goals", ("goal", "goals", "gl")),
    ("Approval", "approvals", ("approval", "approvals", "apr")),
    ("Evidence", "evidences", ("evidence", "evidences", "ev")),
):
    for _alias in _aliases:
        KINDS[_alias] = (_kind, _plural)


def _status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def _spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def cost(value: Any) -> str:
    return f"${float(value or 0):.4f}"


def short_sha(value: Any) -> str:
    return str(value or "")[:12]


def _session_cells(s: Obj, now: float) -> tuple[Row, Row]:
    st = _status(s)
    usage = st.get("usage") or {}
    last = st.get("lastTurn") or {}
    children = st.get("children") or {}
    base = [
        str(_spec(s).get("agentRef", "")),
        str(st.get("phase") or "Pending"),
        str(st.get("turns") or 0),
        str(last.get("outcome") or ""),
        cost(usage.get("cost")),
    ]
    wide = [
        str(children.get("total") or 0),
        str((_spec(s).get("parentRef") or {}).get("name") or ""),
        str(st.get("podName") or ""),
        short_sha((st.get("delivery") or {}).get("revision")),
        str(st.get("message") or ""),
    ]
    return [*base, age(s["metadata"].get("creationTimestamp"), now)], wide


def _goal_cells(g: Obj, now: float) -> tuple[Row, Row]:
    st = _status(g)
    base = [
        str(st.get("verdict") or "Pending"),
        f"{st.get('waves') or 0}/{_spec(g).get('maxWaves', 3)}",
        str(st.get("session") or ""),
    ]
    wide = [
        str((_spec(g).get("success") or {}).get("name") or ""),
        short_sha(st.get("revision")),
        str(st.get("message") or ""),
    ]
    return [*base, age(g["metadata"].get("creationTimestamp"), now)], wide


def _evidence_cells(e: Obj, now: float) -> tuple[Row, Row]:
    st = _status(e)
    exit_code = st.get("exitCode")
    base = [
        str(_spec(e).get("check") or ""),
        short_sha(_spec(e).get("revision")),
        str(st.get("verdict") or "Pending"),
        "" if exit_code is None else str(exit_code),
    ]
    wide = [str(_spec(e).get("repo") or ""), str(_spec(e).get("image") or "")]
    return [*base, age(e["metadata"].get("creationTimestamp"), now)], wide


def describe_action(approval: Obj, width: int = 60) -> str:
    """The exact call an Approval names, cut to `width` characters."""
    from corral_api.decisions import approval_action

    text = approval_action(approval)
    return text if len(text) <= width else text[: width - 1] + "…"


def _approval_cells(a: Obj, now: float) -> tuple[Row, Row]:
    from corral_api.decisions import approval_decision, approval_session

    base = [
        approval_session(a),
        describe_action(a),
        approval_decision(a),
        str(_status(a).get("decidedBy") or ""),
    ]
    wide = [str(_status(a).get("comment") or ""), str(_spec(a).get("reason") or "")]
    return [*base, age(a["metadata"].get("creationTimestamp"), now)], wide


HEADERS: dict[str, tuple[Row, Row]] = {
    "Session": (
        ["AGENT", "PHASE", "TURNS", "OUTCOME", "COST", "AGE"],
        ["CHILDREN", "PARENT", "POD", "REVISION", "MESSAGE"],
    ),
    "Goal": (["VERDICT", "WAVES", "SESSION", "AGE"], ["CHECK", "REVISION", "MESSAGE"]),
    "Evidence": (["CHECK", "REVISION", "VERDICT", "EXIT", "AGE"], ["REPO", "IMAGE"]),
    "Approval": (
        ["SESSION", "ACTION", "DECISION", "DECIDED BY", "AGE"],
        ["COMMENT", "REASON"],
    ),
}
_CELLS: dict[str, Callable[[Obj, float], tuple[Row, Row]]] = {
    "Session": _session_cells,
    "Goal": _goal_cells,
    "Evidence": _evidence_cells,
    "Approval": _approval_cells,
}


def rows(
    kind: str, items: list[Obj], now: float, *, wide: bool = False, namespaces: bool = False
) -> list[Row]:
    """The header and one row per object, sorted by namespace then name (as kubectl does)."""
    base, extra = HEADERS[kind]
    header = (["NAMESPACE"] if namespaces else []) + ["NAME", *base] + (extra if wide else [])
    out = [header]
    ordered = sorted(
        items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
    )
    for obj in ordered:
        cells, more = _CELLS[kind](obj, now)
        lead = [obj["metadata"].get("namespace", "")] if namespaces else []
        out.append(lead + [obj["metadata"]["name"], *cells] + (more if wide else []))
    return out
