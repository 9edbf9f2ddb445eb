"""The tables of `corral get` (kubectl's shape: upper-case headers, NAMESPACE first with -A,
the priority-1 columns with `-o wide`). The columns are the CRDs' additionalPrinterColumns,
read from the KindInfo they are generated from, so `corral get` and `kubectl get` agree. Pure:
objects in, rows out."""

from __future__ import annotations

from typing import Any

from ._cluster import age

Obj = dict[str, Any]
Row = list[str]

# The word a person types -> (kind, plural): the plural, singular and short names the CRDs
# declare (a unit test holds this to corral_api's KindInfo), and `evidence` as people say it.
KINDS: dict[str, tuple[str, str]] = {}
for _kind, _plural, _aliases in (
    ("Session", "sessions", ("session", "sessions", "sess", "cs")),
    ("Agent", "agents", ("agent", "agents", "ag")),
    ("Goal", "goals", ("goal", "goals", "gl")),
    ("Approval", "approvals", ("approval", "approvals", "apr")),
    ("Evidence", "evidences", ("evidence", "evidences", "ev")),
    ("Freeze", "freezes", ("freeze", "freezes", "frz")),
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


def describe_action(approval: Obj, width: int = 60) -> str:
    """The exact call an Approval names, cut to `width` characters."""
    from corral_api.decisions import approval_action

    text = approval_action(approval)
    return text if len(text) <= width else text[: width - 1] + "…"


# What an empty cell means where the API leaves a field unset on purpose: an Approval no
# person has decided yet carries no decision (kubectl shows a blank there; corral says it).
_UNSET = {("Approval", ".status.decision"): "Pending"}


def _cell(column: Any, obj: Obj, now: float, kind: str = "") -> str:
    """One printer column's cell, as the API server's table has it: a date as kubectl's AGE,
    several values joined by commas, nothing when the path reaches nothing."""
    from ._jsonpath import evaluate, text_of

    values = evaluate(column.json_path, obj)
    if not values:
        return _UNSET.get((kind, column.json_path), "")
    if column.type == "date":
        return age(str(values[0]), now)
    return ",".join(text_of(v) for v in values)


def printer_columns(kind: str, *, wide: bool) -> list[Any]:
    """The CRD's additionalPrinterColumns for `kind` (priority 0 only, unless wide): the same
    KindInfo `make crds` writes them from."""
    from corral_api import KIND_BY_NAME

    return [c for c in KIND_BY_NAME[kind].info.columns if wide or not c.priority]


def _ordered(items: list[Obj]) -> list[Obj]:
    return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


def rows(
    kind: str,
    items: list[Obj],
    now: float,
    *,
    wide: bool = False,
    namespaces: bool = False,
    header: bool = True,
) -> list[Row]:
    """The header and one row per object, sorted by namespace then name (as kubectl does):
    NAME, then the CRD's printer columns (with `wide`, those of priority 1 too)."""
    columns = printer_columns(kind, wide=wide)
    out: list[Row] = []
    if header:
        out.append(
            (["NAMESPACE"] if namespaces else []) + ["NAME"] + [c.name.upper() for c in columns]
        )
    for obj in _ordered(items):
        lead = [obj["metadata"].get("namespace", "")] if namespaces else []
        out.append(lead + [obj["metadata"]["name"]] + [_cell(c, obj, now, kind) for c in columns])
    return out


def custom_rows(
    columns: list[tuple[str, str]], items: list[Obj], *, header: bool = True
) -> list[Row]:
    """`-o custom-columns=`: the given headers, a cell per path (`<none>` for nothing)."""
    from ._jsonpath import column_cell

    out: list[Row] = [[h for h, _ in columns]] if header else []
    out += [[column_cell(path, obj) for _, path in columns] for obj in items]
    return out


def resource_name(kind: str, obj: Obj) -> str:
    """`-o name`: `session.corral.dev/NAME`, as kubectl names a custom resource."""
    return f"{kind.lower()}.corral.dev/{obj['metadata']['name']}"
