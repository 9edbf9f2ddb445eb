"""`corral describe KIND NAME`: one object the way `kubectl describe` tells it. A Session is a
story: spec, phase, cost, the last turn, the plan, children, conditions, every turn's receipt
and the Events (its receipts from the operator's archive reader, live or archived). Every other
kind (agents, goals, approvals, evidence, freezes) shows its fields, its conditions and its
Events. Everything else comes from the API server with the caller's kubeconfig (docs/cli.md).
Exit status: 0 described, 2 anything else (bad usage, the API server refusing or unreachable,
NAME not there)."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Sequence
from typing import Any

from ._cluster import add_cluster_options, age, connect, guarded, not_found, table
from ._errors import EXIT_OK, Parser, exit_epilog, offer
from ._reader import ReaderClient, ReaderUnavailable, add_reader_options
from ._tables import KINDS, cost
from ._view import ledger_line, plan_lines

Obj = dict[str, Any]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="corral describe", description=__doc__, epilog=exit_epilog())
    offer(
        p.add_argument(
            "kind", help="session, agent, goal, approval, evidence or freeze (or a short name)"
        ),
        ("session", "agent", "goal", "approval", "evidence", "freeze"),
    )
    p.add_argument("name", help="the object's name")
    add_reader_options(p)
    add_cluster_options(p)
    return p


def _words(key: str) -> str:
    """A camelCase field as kubectl describe titles it: `maxTurns` -> `Max Turns`."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", key)
    return spaced[:1].upper() + spaced[1:]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return " ".join(str(value).split()) if isinstance(value, str) else str(value)


def field_lines(value: Any, depth: int = 0) -> list[str]:
    """A nested object as kubectl describe prints one: `Title:  value`, maps indented under
    their title, each list item under a `-`."""
    pad = "  " * depth
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_words(str(key))}:")
                out.extend(field_lines(item, depth + 1))
            else:
                shown = "<none>" if item in (None, {}, []) else _scalar(item)
                out.append(f"{pad}{_words(str(key))}:  {shown}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                inner = field_lines(item, depth + 1)
                out.append(f"{pad}- " + inner[0].lstrip())
                out.extend(inner[1:])
            else:
                out.append(f"{pad}- {_scalar(item)}")
    else:
        out.append(f"{pad}{_scalar(value)}")
    return out


def _pairs(values: Any) -> str:
    if not values:
        return "<none>"
    return "\n               ".join(f"{k}={v}" for k, v in sorted(values.items()))


def conditions_table(conds: list[Obj]) -> str:
    rows = [["TYPE", "STATUS", "REASON", "MESSAGE"]]
    rows += [[c.get("type", ""), c.get("status", ""), c.get("reason", ""),
              " ".join(str(c.get("message", "")).split())[:120]] for c in conds]  # fmt: skip
    return _indent(table(rows))


def events_lines(events: list[Obj], now: float) -> list[str]:
    lines = ["Events:" + ("        <none>" if not events else "")]
    if events:
        rows = [["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]]
        for e in events:
            when = (
                e.get("lastTimestamp")
                or e.get("eventTime")
                or e["metadata"].get("creationTimestamp")
            )
            source = (e.get("source") or {}).get("component") or e.get("reportingComponent")
            rows.append([str(e.get("type", "")), str(e.get("reason", "")), age(when, now),
                         str(source or ""),
                         " ".join(str(e.get("message", "")).split())[:120]])  # fmt: skip
        lines.append(_indent(table(rows)))
    return lines


def render_object(obj: Obj, events: list[Obj], now: float) -> str:
    """Any kind but a Session: metadata, spec, status (conditions as a table), Events."""
    md = obj["metadata"]
    status = dict(obj.get("status") or {})
    conds = status.pop("conditions", None) or []
    lines = [
        f"Name:          {md['name']}",
        f"Namespace:     {md.get('namespace', '')}",
        f"Kind:          {obj.get('kind', '')}",
        f"Labels:        {_pairs(md.get('labels'))}",
        f"Annotations:   {_pairs(md.get('annotations'))}",
        f"Created:       {md.get('creationTimestamp') or '<unknown>'} "
        f"({age(md.get('creationTimestamp'), now)} ago)",
        "Spec:" + ("" if obj.get("spec") else "          <none>"),
    ]
    lines += field_lines(obj.get("spec") or {}, 1)
    lines.append("Status:" + ("" if status else "        <none>"))
    lines += field_lines(status, 1)
    lines.append("Conditions:" + ("" if conds else "    <none>"))
    if conds:
        lines.append(conditions_table(conds))
    lines += events_lines(events, now)
    return "\n".join(lines)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def receipt_lines(receipts: list[Obj]) -> list[str]:
    """One line per settled submission, then its ledger (the same words as `corral run`)."""
    out: list[str] = []
    for r in receipts:
        head = f"{r.get('settlement')}. {r.get('status')}"
        error = r.get("error")
        if isinstance(error, dict):
            head += f" ({error.get('type')}: {error.get('message', '')})"
        usage = r.get("usage") or {}
        if usage:
            head += (
                f"  tokens in {usage.get('input', 0)} out {usage.get('output', 0)}"
                f"  {cost(usage.get('cost'))}"
            )
        out.append(head)
        if isinstance(r.get("receipt"), dict):
            receipt = r["receipt"]
            out.append(_indent(ledger_line(receipt, error)[1], "   "))
            if receipt.get("toolsRun"):
                out.append(f"   tools: {', '.join(receipt['toolsRun'])}")
    return out


def egress_lines(egress: Obj) -> str:
    """The gateway's decisions (docs/egress.md): totals, then a row per destination."""
    head = f"{egress.get('allowed', 0)} allowed, {egress.get('denied', 0)} denied"
    if egress.get("observedAt"):
        head += f" (as of {egress['observedAt']})"
    rows = [["DECISION", "WHO", "DESTINATION", "COUNT", "BYTES UP/DOWN", "REASON"]]
    for h in egress.get("hosts") or []:
        rows.append([str(h.get("decision", "")), str(h.get("identity", "")),
                     f"{h.get('host')}:{h.get('port')}", str(h.get("count", 0)),
                     f"{h.get('bytesUp', 0)}/{h.get('bytesDown', 0)}",
                     " ".join(str(h.get("reason") or "").split())[:80]])  # fmt: skip
    out = [head, table(rows)] if len(rows) > 1 else [head]
    if egress.get("moreHosts"):
        out.append(f"... and {egress['moreHosts']} more destinations")
    return "\n".join(out)


def render(
    session: Obj,
    children: list[Obj],
    events: list[Obj],
    receipts: list[Obj] | None,
    transcript_note: str,
    now: float,
) -> str:
    md, spec, st = session["metadata"], session.get("spec") or {}, session.get("status") or {}
    usage = st.get("usage") or {}
    lines = [
        f"Name:          {md['name']}",
        f"Namespace:     {md.get('namespace', '')}",
        f"Agent:         {spec.get('agentRef', '')}",
        f"Parent:        {(spec.get('parentRef') or {}).get('name') or '<none>'}",
        f"Task:          {' '.join(str(spec.get('task', '')).split())[:200]}",
        f"Phase:         {st.get('phase') or 'Pending'}",
        f"Message:       {st.get('message') or ''}",
        f"Pod:           {st.get('podName') or '<none>'}",
        f"Turns:         {st.get('turns') or 0}",
        f"Started:       {st.get('startedAt') or '<not yet>'}",
        f"Finished:      {st.get('finishedAt') or '<not yet>'}",
        f"Cost:          {cost(usage.get('cost'))}  tokens in {usage.get('inputTokens', 0)} "
        f"out {usage.get('outputTokens', 0)} cache r/w {usage.get('cacheReadTokens', 0)}/"
        f"{usage.get('cacheWriteTokens', 0)}",
        f"Age:           {age(md.get('creationTimestamp'), now)}",
    ]
    if st.get("delivery"):
        d = st["delivery"]
        lines.append(f"Delivery:      {d.get('state')} {d.get('branch') or ''} "
                     f"{d.get('revision') or ''}".rstrip())  # fmt: skip
    last = st.get("lastTurn")
    if last:
        lines.append(
            f"Last turn:     turn {last.get('turn')} {last.get('outcome')} via "
            f"{last.get('route')} (ran {last.get('handler')}); {last.get('toolsRun', 0)} tools "
            f"run, {last.get('toolsBlocked', 0)} blocked; {last.get('tokens', 0)} tokens"
        )
        lines.append(f"  phases:      {' → '.join(last.get('phasePath') or [])}")
    if st.get("plan"):
        lines.append("Plan:")
        lines.append(_indent(plan_lines(st["plan"])))
    if st.get("question"):
        lines.append(f"Question:      {st['question']}")
    if st.get("egress"):
        lines.append("Egress:")
        lines.append(_indent(egress_lines(st["egress"])))
    lines.append("Children:" + ("      <none>" if not children else ""))
    if children:
        rows = [["NAME", "PHASE", "TURNS", "COST"]]
        for c in sorted(children, key=lambda c: c["metadata"]["name"]):
            cs = c.get("status") or {}
            spent = cost((cs.get("usage") or {}).get("cost"))
            phase = str(cs.get("phase") or "Pending")
            rows.append([c["metadata"]["name"], phase, str(cs.get("turns") or 0), spent])
        lines.append(_indent(table(rows)))
    lines.append("Conditions:")
    lines.append(conditions_table(st.get("conditions") or []))
    lines.append(f"Receipts:      {transcript_note}")
    if receipts:
        lines.extend(_indent(line) for line in receipt_lines(receipts))
    lines += events_lines(events, now)
    return "\n".join(lines)


async def transcript_of(args: argparse.Namespace, kube: Any, namespace: str) -> tuple[
    list[Obj] | None, str
]:  # fmt: skip
    """The receipts from the archive reader, and a note that says where they came from."""
    from corral_operator.archive import receipts_of

    try:
        reader = await ReaderClient.from_args(args, kube, namespace)
    except ReaderUnavailable as why:
        return None, f"<not read: {why}>"
    try:
        page = await reader.transcript(0, 0)
        record = await reader.record()
    except ReaderUnavailable as why:
        return None, f"<not read: {why}>"
    finally:
        await reader.aclose()
    if page is None:
        return None, "<no transcript: the Session was never archived>"
    receipts = receipts_of(page["events"])
    note = f"{len(page['events'])} wire events, {len(receipts)} settled ({page['source']}"
    if record is not None:
        note += f", archived {record.get('archivedAt')} on {record.get('cause')}"
    return receipts, note + ")"


async def _events(kube: Any, namespace: str, kind: str, name: str) -> list[Obj]:
    """The object's Events, oldest first (as kubectl describe lists them)."""
    selector = f"involvedObject.name={name},involvedObject.kind={kind}"
    found = await kube.request(
        "GET", f"/api/v1/namespaces/{namespace}/events", query=[("fieldSelector", selector)]
    )
    return sorted(
        (found or {}).get("items") or [],
        key=lambda e: e.get("lastTimestamp") or e["metadata"].get("creationTimestamp") or "",
    )


async def _describe(args: argparse.Namespace) -> int:
    kind, plural = KINDS[args.kind]
    kube, namespace = await connect(args)
    from corral_operator.kube import corral_path

    try:
        obj = await kube.get(corral_path(kind, namespace, args.name))
        if obj is None:
            raise not_found(plural, args.name, namespace)
        events = await _events(kube, namespace, kind, args.name)
        if kind != "Session":
            print(render_object(obj, events, time.time()))
            return EXIT_OK
        siblings = await kube.list(corral_path("Session", namespace))
        children = [
            s for s in siblings
            if ((s.get("spec") or {}).get("parentRef") or {}).get("name") == args.name
        ]  # fmt: skip
        receipts, note = await transcript_of(args, kube, namespace)
    finally:
        await kube.close()
    print(render(obj, children, events, receipts, note, time.time()))
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    p = build_parser()
    args = p.parse_args(list(argv))
    if args.kind not in KINDS:
        p.error(
            f"unknown kind {args.kind!r}: session, agent, goal, approval, evidence or freeze "
            "(or their short names)"
        )
    return guarded("describe", _describe(args))
