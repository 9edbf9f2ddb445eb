"""The console's pages: pure functions from API objects (plain dicts) to HTML.

Server-rendered, no template engine and no frontend build: every value goes through `esc`, and
the one script (`console.js`) adds the live parts (the turn stream, the status refresh, the
decision buttons) on top of pages that read fine without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from html import escape
from typing import Any
from urllib.parse import quote

from corral_api.decisions import PENDING, approval_action, approval_decision, approval_session
from corral_api.timestamps import age

Obj = dict[str, Any]


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _q(part: str) -> str:
    return quote(part, safe="")


def session_href(namespace: str, name: str) -> str:
    return f"/ns/{_q(namespace)}/sessions/{_q(name)}"


def cost(status: Obj) -> str:
    return f"${float((status.get('usage') or {}).get('cost') or 0.0):.4f}"


def tokens(status: Obj) -> int:
    usage = status.get("usage") or {}
    return sum(int(usage.get(k) or 0) for k in ("inputTokens", "outputTokens"))


def _layout(title: str, person: str, body: str, *, script: bool = False) -> str:
    who = (
        f'<span class="who">{esc(person)}</span>'
        '<form method="post" action="/logout" class="inline"><button>Sign out</button></form>'
        if person
        else ""
    )
    js = '<script src="/static/console.js" defer></script>' if script else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · Corral</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/console.css">{js}</head>
<body><header><a class="brand" href="/">Corral</a>
<nav><a href="/">Fleet</a><a href="/goals">Goals</a><a href="/approvals">Approvals</a></nav>
<span class="right">{who}</span></header>
<main>{body}</main></body></html>"""


def error_page(status: int, error: str, reason: str, person: str = "") -> str:
    body = f'<h1>{status}: {esc(error)}</h1><p class="reason">{esc(reason)}</p>'
    return _layout(error, person, body)


def login_page(message: str = "") -> str:
    note = f'<p class="reason">{esc(message)}</p>' if message else ""
    body = f"""<h1>Sign in</h1>{note}
<p>Paste a Kubernetes bearer token: the console acts as that identity and the API server's RBAC
decides what you see and may decide (<code>kubectl create token NAME</code>, or your
kubeconfig's token).</p>
<form method="post" action="/login" class="login">
<textarea name="token" rows="4" cols="70" required placeholder="eyJhbGciOi..."></textarea>
<button type="submit">Sign in</button></form>"""
    return _layout("Sign in", "", body)


# ------------------------------------------------------------------------------- the fleet


def _phase(phase: str | None) -> str:
    p = phase or "Pending"
    return f'<span class="phase phase-{esc(p)}">{esc(p)}</span>'


def session_tree(sessions: list[Obj]) -> list[tuple[int, Obj]]:
    """Sessions ordered as a tree: each child right under its parent, with its depth. A child
    whose parent is not listed is shown at the top level."""
    names = {s["metadata"]["name"] for s in sessions}
    children: dict[str | None, list[Obj]] = {}
    for s in sessions:
        parent = ((s.get("spec") or {}).get("parentRef") or {}).get("name")
        children.setdefault(parent if parent in names else None, []).append(s)
    ordered: list[tuple[int, Obj]] = []

    def walk(parent: str | None, depth: int, seen: frozenset[str]) -> None:
        kids = children.get(parent, [])
        for s in sorted(kids, key=lambda s: s["metadata"].get("creationTimestamp", "")):
            name = s["metadata"]["name"]
            if name in seen:  # a cycle of parentRefs: show it once
                continue
            ordered.append((depth, s))
            walk(name, depth + 1, seen | {name})

    walk(None, 0, frozenset())
    return ordered


def fleet_page(person: str, by_namespace: dict[str, list[Obj]], hidden: int, now: float) -> str:
    parts = ["<h1>Fleet</h1>"]
    if not by_namespace:
        parts.append('<p class="empty">No namespace you may read has Sessions.</p>')
    for namespace, sessions in sorted(by_namespace.items()):
        phases: dict[str, int] = {}
        for s in sessions:
            p = (s.get("status") or {}).get("phase") or "Pending"
            phases[p] = phases.get(p, 0) + 1
        summary = " ".join(f"{_phase(p)}&nbsp;{n}" for p, n in sorted(phases.items()))
        total = sum(float(((s.get("status") or {}).get("usage") or {}).get("cost") or 0)
                    for s in sessions)  # fmt: skip
        parts.append(
            f'<section class="ns" data-namespace="{esc(namespace)}"><h2>{esc(namespace)} '
            f"<small>{len(sessions)} sessions · ${total:.4f}</small></h2>"
            f'<p class="phases">{summary}</p>'
            '<table class="fleet"><thead><tr><th>Session</th><th>Agent</th><th>Phase</th>'
            "<th>Turns</th><th>Tokens</th><th>Cost</th><th>Children</th><th>Age</th></tr>"
            "</thead><tbody>"
        )
        for depth, s in session_tree(sessions):
            md, st = s["metadata"], s.get("status") or {}
            kids = st.get("children") or {}
            parts.append(
                f'<tr class="session" data-session="{esc(md["name"])}">'
                f'<td style="padding-left:{0.5 + 1.5 * depth}em">{"└ " if depth else ""}'
                f'<a href="{session_href(namespace, md["name"])}">{esc(md["name"])}</a></td>'
                f"<td>{esc((s.get('spec') or {}).get('agentRef'))}</td>"
                f"<td>{_phase(st.get('phase'))}</td><td>{int(st.get('turns') or 0)}</td>"
                f"<td>{tokens(st)}</td><td>{cost(st)}</td>"
                f"<td>{int(kids.get('total') or 0) or ''}</td>"
                f"<td>{age(md.get('creationTimestamp'), now)}</td></tr>"
            )
        parts.append("</tbody></table></section>")
    if hidden:
        parts.append(f'<p class="empty">{hidden} namespaces are not yours to read.</p>')
    return _layout("Fleet", person, "".join(parts))


# ------------------------------------------------------------------------------- a session


def _dl(pairs: Iterable[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def plan_html(plan: Obj | None) -> str:
    if not plan:
        return '<p class="empty">No plan.</p>'
    rows = "".join(
        f'<li class="step verdict-{esc(s.get("verdict"))}"><b>{esc(s.get("verdict"))}</b> '
        f"{esc(s.get('action'))} <small>{esc(s.get('detail'))}</small></li>"
        for s in plan.get("steps") or []
    )
    return f'<p>Plan {esc(plan.get("state"))}</p><ol class="plan">{rows}</ol>'


def conditions_html(conditions: list[Obj]) -> str:
    return "".join(
        f"<tr><td>{esc(c.get('type'))}</td><td>{esc(c.get('status'))}</td>"
        f"<td>{esc(c.get('reason'))}</td><td>{esc(c.get('message'))}</td></tr>"
        for c in conditions
    )


def receipt_html(last: Obj | None) -> str:
    if not last:
        return '<p class="empty">No turn settled yet.</p>'
    return _dl(
        [
            ("turn", esc(last.get("turn"))),
            ("route / handler", f"{esc(last.get('route'))} / {esc(last.get('handler'))}"),
            ("outcome", esc(last.get("outcome"))),
            (
                "tools run / blocked",
                f"{esc(last.get('toolsRun'))} / {esc(last.get('toolsBlocked'))}",
            ),
            ("tokens", esc(last.get("tokens"))),
            ("phase path", esc(" → ".join(last.get("phasePath") or []))),
        ]
    )


def egress_html(egress: Obj | None) -> str:
    """The egress gateway's decisions for the Session's pod (docs/egress.md)."""
    if not egress:
        return '<p class="empty">No egress through the gateway recorded.</p>'
    rows = "".join(
        f'<tr class="egress decision-{esc(h.get("decision"))}"><td>{esc(h.get("decision"))}</td>'
        f"<td>{esc(h.get('identity'))}</td><td>{esc(h.get('host'))}:{esc(h.get('port'))}</td>"
        f"<td>{esc(h.get('count'))}</td>"
        f"<td>{esc(h.get('bytesUp', 0))} / {esc(h.get('bytesDown', 0))}</td>"
        f"<td>{esc(h.get('reason'))}</td></tr>"
        for h in egress.get("hosts") or []
    )
    more = egress.get("moreHosts") or 0
    tail = f"<p>… and {int(more)} more destinations</p>" if more else ""
    return (
        f"<p>{int(egress.get('allowed') or 0)} allowed, {int(egress.get('denied') or 0)} denied"
        f" <small>as of {esc(egress.get('observedAt'))}</small></p>"
        '<table class="egress"><tr><th>decision</th><th>who</th><th>destination</th>'
        f"<th>count</th><th>bytes up / down</th><th>reason</th></tr>{rows}</table>{tail}"
    )


def receipts_html(archive: Obj | None) -> str:
    """Every turn's receipt as the archive keeps it (docs/history.md), one row a settlement."""
    if not archive:
        return '<p class="empty">Not archived (yet): the sandbox still runs, or just went.</p>'
    rows = "".join(
        f'<tr class="receipt status-{esc(r.get("status"))}"><td>{esc(r.get("settlement"))}</td>'
        f"<td>{esc(r.get('status'))}</td>"
        f"<td>{esc((r.get('error') or {}).get('type'))}</td>"
        f"<td>{esc((r.get('receipt') or {}).get('outcome'))}</td>"
        f"<td>{esc((r.get('receipt') or {}).get('route'))}</td>"
        f"<td>{esc(_usage_cost(r.get('usage')))}</td></tr>"
        for r in archive.get("receipts") or []
    )
    head = (
        f'<p class="archived">Archived {esc(archive.get("archivedAt"))} '
        f"({esc(archive.get('cause'))}, {esc(archive.get('events'))} events)</p>"
    )
    if not rows:
        return head + '<p class="empty">No turn settled.</p>'
    return head + (
        '<table class="receipts"><thead><tr><th>#</th><th>Status</th><th>Error</th>'
        "<th>Outcome</th><th>Route</th><th>Cost</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _usage_cost(usage: Obj | None) -> str:
    if not usage or usage.get("cost") is None:
        return ""
    return f"${float(usage['cost']):.4f}"


def approval_rows(approvals: list[Obj], deciders: set[str], now: float) -> str:
    """One row per Approval; Approve/Deny buttons where this person may decide (the namespace
    is in `deciders`) and the Approval is still pending."""
    if not approvals:
        return '<p class="empty">No approvals.</p>'
    rows = []
    for a in sorted(approvals, key=lambda a: a["metadata"].get("creationTimestamp", "")):
        md, spec, st = a["metadata"], a.get("spec") or {}, a.get("status") or {}
        ns, decision = md.get("namespace", ""), approval_decision(a)
        if decision == PENDING and ns in deciders:
            target = f"/ns/{_q(ns)}/approvals/{_q(md['name'])}/decide"
            control = (
                f'<form method="post" action="{target}" class="decide" '
                f'data-approval="{esc(md["name"])}" data-namespace="{esc(ns)}">'
                '<input name="reason" placeholder="reason (optional)">'
                '<button name="decision" value="Approved" class="approve">Approve</button>'
                '<button name="decision" value="Denied" class="deny">Deny</button></form>'
            )
        elif decision == PENDING:
            control = '<span class="muted">you may not decide</span>'
        else:
            control = f"{esc(decision)} by {esc(st.get('decidedBy'))}"
        session = approval_session(a)
        rows.append(
            f'<tr class="approval" data-approval="{esc(md["name"])}">'
            f"<td>{esc(ns)}</td><td>{esc(md['name'])}</td>"
            f'<td><a href="{session_href(ns, session)}">{esc(session)}</a></td>'
            f"<td><code>{esc(approval_action(a))}</code></td>"
            f"<td>{esc(spec.get('reason'))}</td><td>{age(md.get('creationTimestamp'), now)}</td>"
            f'<td class="decision">{control}</td></tr>'
        )
    return (
        '<table class="approvals"><thead><tr><th>Namespace</th><th>Approval</th>'
        "<th>Session</th><th>Action</th><th>Reason</th><th>Age</th><th>Decision</th></tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def session_page(
    person: str,
    session: Obj,
    children: list[Obj],
    approvals: list[Obj],
    may_decide: bool,
    now: float,
    archive: Obj | None = None,
) -> str:
    md, spec, st = session["metadata"], session.get("spec") or {}, session.get("status") or {}
    ns, name = md["namespace"], md["name"]
    parent = (spec.get("parentRef") or {}).get("name")
    facts = _dl(
        [
            ("phase", f'<span id="phase">{_phase(st.get("phase"))}</span>'),
            ("agent", esc(spec.get("agentRef"))),
            ("turns", f'<span id="turns">{int(st.get("turns") or 0)}</span>'),
            ("tokens", f'<span id="tokens">{tokens(st)}</span>'),
            ("cost so far", f'<span id="cost">{cost(st)}</span>'),
            ("age", age(md.get("creationTimestamp"), now)),
            ("parent", f'<a href="{session_href(ns, parent)}">{esc(parent)}</a>' if parent else ""),
            ("message", f'<span id="message">{esc(st.get("message"))}</span>'),
        ]
    )
    kids = "".join(
        f'<li><a href="{session_href(ns, c["metadata"]["name"])}">{esc(c["metadata"]["name"])}'
        f"</a> {_phase((c.get('status') or {}).get('phase'))} {cost(c.get('status') or {})}</li>"
        for c in children
    )
    conditions = conditions_html(st.get("conditions") or [])
    boot = json.dumps({"namespace": ns, "session": name}).replace("</", "<\\/")
    body = f"""<h1>Session {esc(name)} <small>{esc(ns)}</small></h1>
<div class="cols"><div class="col-main">
<h2>Task</h2><pre class="task">{esc(spec.get("task"))}</pre>
<h2>Live turn <small id="stream-state">connecting…</small></h2>
<ol id="stream" class="stream"></ol>
<h2>Answer</h2><pre id="answer" class="answer">{esc(st.get("answer"))}</pre>
</div><div class="col-side">
<h2>Status</h2>{facts}
<h2>Approvals</h2><div id="approvals" data-may-decide="{str(may_decide).lower()}">
{approval_rows(approvals, {ns} if may_decide else set(), now)}</div>
<h2>Plan</h2><div id="plan">{plan_html(st.get("plan"))}</div>
<h2>Last turn's receipt</h2><div id="receipt">{receipt_html(st.get("lastTurn"))}</div>
<h2>Receipts</h2><div id="receipts">{receipts_html(archive)}</div>
<h2>Egress</h2><div id="egress">{egress_html(st.get("egress"))}</div>
<h2>Children</h2><ul class="children">{kids or '<li class="empty">none</li>'}</ul>
<h2>Conditions</h2><table class="conditions" id="conditions">{conditions}</table>
</div></div>
<script type="application/json" id="boot">{boot}</script>"""
    return _layout(f"Session {name}", person, body, script=True)


# ---------------------------------------------------------------------------------- goals


def goals_page(person: str, goals: list[Obj], evidences: list[Obj], now: float) -> str:
    verdicts = {
        (e["metadata"].get("namespace"), e["metadata"]["name"]): (e.get("status") or {})
        for e in evidences
    }
    parts = ["<h1>Goals</h1>"]
    if not goals:
        parts.append('<p class="empty">No Goals you may read.</p>')
    for g in sorted(goals, key=lambda g: (g["metadata"].get("namespace"), g["metadata"]["name"])):
        md, spec, st = g["metadata"], g.get("spec") or {}, g.get("status") or {}
        ns = md.get("namespace", "")
        waves = []
        for w in st.get("history") or []:
            ev = verdicts.get((ns, w.get("evidence")), {})
            waves.append(
                f'<tr class="wave"><td>{esc(w.get("wave"))}</td>'
                f'<td><a href="{session_href(ns, w.get("session", ""))}">{esc(w.get("session"))}'
                f"</a></td><td>{esc(w.get('phase'))}</td>"
                f"<td><code>{esc((w.get('revision') or '')[:12])}</code></td>"
                f"<td>{esc(w.get('evidence'))} {esc(ev.get('verdict', ''))}</td>"
                f'<td class="verdict-{esc(w.get("verdict"))}">{esc(w.get("verdict"))}</td>'
                f"<td>{esc(w.get('message'))}</td></tr>"
            )
        parts.append(
            f'<section class="goal" data-goal="{esc(md["name"])}"><h2>{esc(md["name"])} '
            f"<small>{esc(ns)} · {esc(st.get('verdict') or 'Pending')} · "
            f"{int(st.get('waves') or 0)}/{esc(spec.get('maxWaves', 3))} waves · "
            f"{age(md.get('creationTimestamp'), now)}</small></h2>"
            f"<p>{esc(spec.get('description'))}</p>"
            '<table class="waves"><thead><tr><th>Wave</th><th>Session</th><th>Phase</th>'
            "<th>Revision</th><th>Evidence</th><th>Verdict</th><th>Message</th></tr></thead>"
            f"<tbody>{''.join(waves)}</tbody></table></section>"
        )
    rows = "".join(
        f"<tr><td>{esc(e['metadata'].get('namespace'))}</td><td>{esc(e['metadata']['name'])}</td>"
        f"<td>{esc((e.get('spec') or {}).get('check'))}</td>"
        f"<td><code>{esc(((e.get('spec') or {}).get('revision') or '')[:12])}</code></td>"
        f'<td class="verdict-{esc((e.get("status") or {}).get("verdict"))}">'
        f"{esc((e.get('status') or {}).get('verdict') or 'Pending')}</td>"
        f"<td>{esc((e.get('status') or {}).get('exitCode'))}</td></tr>"
        for e in evidences
    )
    parts.append(
        "<h2>Evidence</h2>"
        + (
            '<table class="evidence"><thead><tr><th>Namespace</th><th>Evidence</th>'
            "<th>Check</th><th>Revision</th><th>Verdict</th><th>Exit</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            if rows
            else '<p class="empty">No Evidence.</p>'
        )
    )
    return _layout("Goals", person, "".join(parts))


def approvals_page(person: str, approvals: list[Obj], deciders: set[str], now: float) -> str:
    pending = [a for a in approvals if approval_decision(a) == PENDING]
    decided = [a for a in approvals if a not in pending]
    body = (
        "<h1>Approvals</h1><h2>Pending</h2>"
        + approval_rows(pending, deciders, now)
        + "<h2>Decided</h2>"
        + approval_rows(decided, deciders, now)
    )
    return _layout("Approvals", person, body)
