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
from corral_api.kinds import FINAL_PHASES
from corral_api.timestamps import age

from .diffview import changes_html

Obj = dict[str, Any]
# Set by `corral console --state` on each run's Session (cli/corral_cli/_console_local.py).
RUN_DIR_ANNOTATION = "corral.dev/state-dir"


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


def _layout(
    title: str, person: str, body: str, *, script: bool = False, sign_out: bool = True
) -> str:
    """The page around `body`. `sign_out`: the person signed in with a token of their own (the
    console in the cluster); under `corral console` they are whoever runs it, so there is no
    signing out."""
    who = f'<span class="who">{esc(person)}</span>' if person else ""
    if person and sign_out:
        who += (
            '<form method="post" action="/logout" class="inline"><button>Sign out</button></form>'
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


def fleet_page(
    person: str,
    by_namespace: dict[str, list[Obj]],
    hidden: int,
    now: float,
    *,
    sign_out: bool = True,
) -> str:
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
            '<div class="scroll"><table class="fleet"><thead><tr><th>Session</th><th>Agent</th>'
            "<th>Phase</th><th>Turns</th><th>Tokens</th><th>Cost</th><th>Children</th>"
            "<th>Age</th></tr></thead><tbody>"
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
        parts.append("</tbody></table></div></section>")
    if hidden:
        parts.append(f'<p class="empty">{hidden} namespaces are not yours to read.</p>')
    return _layout("Fleet", person, "".join(parts), sign_out=sign_out)


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
    """The Conditions section's content: a heading and the table, or nothing at all when the
    Session has none (no empty heading)."""
    if not conditions:
        return ""
    rows = "".join(
        f'<tr class="condition" data-type="{esc(c.get("type"))}"><td>{esc(c.get("type"))}</td>'
        f"<td>{esc(c.get('status'))}</td><td>{esc(c.get('reason'))}</td>"
        f"<td>{esc(c.get('message'))}</td></tr>"
        for c in conditions
    )
    return (
        '<h2>Conditions</h2><div class="scroll"><table class="conditions"><thead><tr>'
        "<th>Type</th><th>Status</th><th>Reason</th><th>Message</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
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
        '<div class="scroll"><table class="receipts"><thead><tr><th>#</th><th>Status</th>'
        "<th>Error</th><th>Outcome</th><th>Route</th><th>Cost</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def _usage_cost(usage: Obj | None) -> str:
    if not usage or usage.get("cost") is None:
        return ""
    return f"${float(usage['cost']):.4f}"


def _decided(status: Obj, decision: str) -> str:
    """Who decided, when, and the reason they gave (`status.comment`)."""
    when = f" <small>{esc(status.get('decidedAt'))}</small>" if status.get("decidedAt") else ""
    comment = status.get("comment")
    said = f'<q class="comment">{esc(comment)}</q>' if comment else ""
    return f"{esc(decision)} by {esc(status.get('decidedBy'))}{when}{said}"


def approval_rows(approvals: list[Obj], deciders: set[str], now: float) -> str:
    """One card per Approval: the exact call, why the harness asked, and Approve / Deny where
    this person may decide (the namespace is in `deciders`) and it is still pending; once
    decided, who decided and the reason they gave. Cards, not a table's row: the call is long
    and the buttons must stay on screen at any width (a phone's included)."""
    if not approvals:
        return '<p class="empty">No approvals.</p>'
    cards = []
    for a in sorted(approvals, key=lambda a: a["metadata"].get("creationTimestamp", "")):
        md, spec, st = a["metadata"], a.get("spec") or {}, a.get("status") or {}
        ns, decision = md.get("namespace", ""), approval_decision(a)
        if decision == PENDING and ns in deciders:
            target = f"/ns/{_q(ns)}/approvals/{_q(md['name'])}/decide"
            control = (
                f'<form method="post" action="{target}" class="decide" '
                f'data-approval="{esc(md["name"])}" data-namespace="{esc(ns)}">'
                '<input name="reason" maxlength="4096" placeholder="reason (optional)" '
                'aria-label="reason">'
                '<span class="buttons">'
                '<button name="decision" value="Approved" class="approve">Approve</button>'
                '<button name="decision" value="Denied" class="deny">Deny</button></span></form>'
            )
        elif decision == PENDING:
            control = '<span class="muted">you may not decide</span>'
        else:
            control = _decided(st, decision)
        session = approval_session(a)
        asked = spec.get("reason")
        cards.append(
            f'<article class="approval decision-{esc(decision)}" data-approval="{esc(md["name"])}">'
            f'<div class="approval-head"><b>{esc(md["name"])}</b> <small>{esc(ns)} · session '
            f'<a href="{session_href(ns, session)}">{esc(session)}</a> · '
            f"{age(md.get('creationTimestamp'), now)}</small></div>"
            f'<pre class="call"><code>{esc(approval_action(a))}</code></pre>'
            + (f'<p class="asked">{esc(asked)}</p>' if asked else "")
            + f'<div class="decision">{control}</div></article>'
        )
    return f'<div class="approvals">{"".join(cards)}</div>'


def _stream_state(phase: str | None) -> str:
    """What the live turn's heading says before its stream says more: a finished Session's turn
    is a record, never "live"."""
    if (phase or "") in FINAL_PHASES:
        return '<small id="stream-state" data-state="ended">finished</small>'
    return '<small id="stream-state">connecting…</small>'


def turns_by_submission(status: Obj, archive: Obj | None) -> dict[str, int]:
    """Each settled submission's turn number, for the Changes' headings: the archive's receipts
    (a settlement each), then the last settlement in status."""
    found: dict[str, int] = {}
    for r in (archive or {}).get("receipts") or []:
        if r.get("submissionId") and r.get("settlement"):
            found[str(r["submissionId"])] = int(r["settlement"])
    last = status.get("lastSettlement") or {}
    if last.get("submissionId") and last.get("turn"):
        found.setdefault(str(last["submissionId"]), int(last["turn"]))
    return found


def delivered_revision(status: Obj) -> str:
    return str((status.get("delivery") or {}).get("revision") or "")


def changes_section(session: Obj, changes: Obj | None, archive: Obj | None) -> str:
    st = session.get("status") or {}
    inner = changes_html(changes, turns_by_submission(st, archive), session["metadata"]["name"])
    pending = ' data-pending="true"' if (changes or {}).get("pending") else ""
    return (
        f'<section id="changes" class="changes" data-revision="{esc(delivered_revision(st))}"'
        f"{pending}>{inner}</section>"
    )


def suspend_controls(namespace: str, name: str, spec: Obj, status: Obj) -> str:
    """The buttons that suspend a running Session (its turn finishes first, or is aborted) or
    resume a suspended one; they post to the console, which patches spec.suspend as the person
    (docs/turns.md, "Suspend and resume")."""
    target = f"/ns/{_q(namespace)}/sessions/{_q(name)}/suspend"
    if spec.get("suspend"):
        state = "suspended" if status.get("phase") == "Suspended" else "suspending"
        buttons = '<button name="action" value="resume">Resume</button>'
    else:
        state = ""
        buttons = (
            '<button name="action" value="suspend" title="the turn in flight finishes first">'
            "Suspend</button> "
            '<button name="action" value="suspendNow" title="the turn in flight is aborted">'
            "Suspend now</button>"
        )
    said = f' <span class="muted" id="suspend-state">{state}</span>' if state else ""
    return (
        f'<h2>Suspend</h2><form method="post" action="{target}" class="suspend">'
        f"{buttons}{said}</form>"
    )


def session_page(
    person: str,
    session: Obj,
    children: list[Obj],
    approvals: list[Obj],
    may_decide: bool,
    now: float,
    archive: Obj | None = None,
    *,
    changes: Obj | None = None,
    sign_out: bool = True,
    may_suspend: bool = False,
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
            ("delivered", f'<span id="delivered">{delivery_html(st.get("delivery"))}</span>'),
            ("message", f'<span id="message">{esc(st.get("message"))}</span>'),
            *_run_dir(md),
        ]
    )
    kids = "".join(
        f'<li><a href="{session_href(ns, c["metadata"]["name"])}">{esc(c["metadata"]["name"])}'
        f"</a> {_phase((c.get('status') or {}).get('phase'))} {cost(c.get('status') or {})}</li>"
        for c in children
    )
    boot = json.dumps({"namespace": ns, "session": name}).replace("</", "<\\/")
    body = f"""<h1>Session {esc(name)} <small>{esc(ns)}</small></h1>
<div class="cols"><div class="col-main">
<h2>Task</h2><pre class="task">{esc(spec.get("task"))}</pre>
<h2>Live turn {_stream_state(st.get("phase"))}</h2>
<ol id="stream" class="stream"></ol>
<h2>Answer</h2><pre id="answer" class="answer">{esc(st.get("answer"))}</pre>
<h2>Changes</h2>{changes_section(session, changes, archive)}
</div><div class="col-side">
<h2>Approvals</h2><div id="approvals" data-may-decide="{str(may_decide).lower()}">
{approval_rows(approvals, {ns} if may_decide else set(), now)}</div>
{suspend_controls(ns, name, spec, st) if may_suspend else ""}<h2>Status</h2>{facts}
<h2>Plan</h2><div id="plan">{plan_html(st.get("plan"))}</div>
<h2>Last turn's receipt</h2><div id="receipt">{receipt_html(st.get("lastTurn"))}</div>
<h2>Receipts</h2><div id="receipts">{receipts_html(archive)}</div>
<h2>Egress</h2><div id="egress">{egress_html(st.get("egress"))}</div>
<h2>Children</h2><ul class="children">{kids or '<li class="empty">none</li>'}</ul>
<section id="conditions">{conditions_html(st.get("conditions") or [])}</section>
</div></div>
<script type="application/json" id="boot">{boot}</script>"""
    return _layout(f"Session {name}", person, body, script=True, sign_out=sign_out)


def _run_dir(metadata: Obj) -> list[tuple[str, str]]:
    """A `corral run`'s directory (`corral console --state`): runs of one Session share its
    name, the directory tells them apart."""
    run = (metadata.get("annotations") or {}).get(RUN_DIR_ANNOTATION)
    return [("state directory", f"<code>{esc(run)}</code>")] if run else []


def delivery_html(delivery: Obj | None) -> str:
    """The last delivery in a line: the revision pushed and where, or why nothing was."""
    if not delivery:
        return '<span class="muted">nothing yet</span>'
    revision = delivery.get("revision")
    pushed = f"<code>{esc(str(revision)[:12])}</code> on " if revision else ""
    branch = f"<code>{esc(delivery.get('branch'))}</code>" if delivery.get("branch") else ""
    state = esc(delivery.get("state"))
    return f"{pushed}{branch} <small>{state}</small>"


# ---------------------------------------------------------------------------------- goals


def goals_page(
    person: str, goals: list[Obj], evidences: list[Obj], now: float, *, sign_out: bool = True
) -> str:
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
            '<div class="scroll"><table class="waves"><thead><tr><th>Wave</th><th>Session</th>'
            "<th>Phase</th><th>Revision</th><th>Evidence</th><th>Verdict</th><th>Message</th>"
            f"</tr></thead><tbody>{''.join(waves)}</tbody></table></div></section>"
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
            '<div class="scroll"><table class="evidence"><thead><tr><th>Namespace</th>'
            "<th>Evidence</th><th>Check</th><th>Revision</th><th>Verdict</th><th>Exit</th>"
            f"</tr></thead><tbody>{rows}</tbody></table></div>"
            if rows
            else '<p class="empty">No Evidence.</p>'
        )
    )
    return _layout("Goals", person, "".join(parts), sign_out=sign_out)


def approvals_page(
    person: str, approvals: list[Obj], deciders: set[str], now: float, *, sign_out: bool = True
) -> str:
    pending = [a for a in approvals if approval_decision(a) == PENDING]
    decided = [a for a in approvals if a not in pending]
    body = (
        "<h1>Approvals</h1><h2>Pending</h2>"
        + approval_rows(pending, deciders, now)
        + "<h2>Decided</h2>"
        + approval_rows(decided, deciders, now)
    )
    return _layout("Approvals", person, body, sign_out=sign_out)
