"""What the console's pages show and leave out (docs/console.md): no sign-out where nobody
signed in, a finished Session's turn never "live", Conditions with their heading or not at
all, and a decision with the reason the person gave."""

from __future__ import annotations

from typing import Any

from corral_operator.console import pages

NOW = 1_800_000_000.0
CREATED = "2027-01-15T08:00:00Z"


def _session(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "s",
            "namespace": "agents",
            "creationTimestamp": "2027-01-15T08:00:00Z",
        },
        "spec": {"agentRef": "coder", "task": "t"},
        "status": status,
    }


def test_sign_out_only_where_a_person_signed_in_with_a_token() -> None:
    signed_in = pages.fleet_page("alice", {}, 0, NOW)
    assert "Sign out" in signed_in and "alice" in signed_in
    local = pages.fleet_page("me (local)", {}, 0, NOW, sign_out=False)
    assert "Sign out" not in local and "/logout" not in local and "me (local)" in local
    page = pages.session_page("me", _session(), [], [], True, NOW, sign_out=False)
    assert "Sign out" not in page
    assert "Sign out" not in pages.approvals_page("me", [], set(), NOW, sign_out=False)
    assert "Sign out" not in pages.goals_page("me", [], [], NOW, sign_out=False)


def test_a_finished_sessions_turn_is_never_live() -> None:
    for phase in ("Succeeded", "Failed"):
        page = pages.session_page("me", _session(phase=phase), [], [], False, NOW)
        assert '<small id="stream-state" data-state="ended">finished</small>' in page
    running = pages.session_page("me", _session(phase="Running"), [], [], False, NOW)
    assert '<small id="stream-state">connecting…</small>' in running


def test_conditions_are_listed_under_their_heading_or_left_out() -> None:
    none = pages.session_page("me", _session(), [], [], False, NOW)
    assert '<section id="conditions"></section>' in none and "<h2>Conditions</h2>" not in none
    ready = {"type": "Ready", "status": "True", "reason": "SandboxReady", "message": "<b>up</b>"}
    page = pages.session_page("me", _session(conditions=[ready]), [], [], False, NOW)
    section = page.split('<section id="conditions">', 1)[1].split("</section>", 1)[0]
    assert section.startswith("<h2>Conditions</h2>")
    assert '<tr class="condition" data-type="Ready"><td>Ready</td><td>True</td>' in section
    assert "&lt;b&gt;up&lt;/b&gt;" in section and "<b>up" not in section


def test_a_decision_shows_who_decided_when_and_the_reason_they_gave() -> None:
    approval = {
        "metadata": {"name": "ap", "namespace": "agents", "creationTimestamp": CREATED},
        "spec": {"sessionRef": {"name": "s"}, "action": {"tool": "bash", "arguments": "{}"},
                 "reason": "git merge always needs a human decision"},
        "status": {"decision": "Denied", "decidedBy": "alice", "decidedAt": "2027-01-15T08:01:00Z",
                   "comment": "not <before> the release"},
    }  # fmt: skip
    card = pages.approval_rows([approval], {"agents"}, NOW)
    assert 'class="approval decision-Denied" data-approval="ap"' in card
    assert "Denied by alice <small>2027-01-15T08:01:00Z</small>" in card
    assert '<q class="comment">not &lt;before&gt; the release</q>' in card
    assert '<p class="asked">git merge always needs a human decision</p>' in card
    pending = {**approval, "status": {}}
    form = pages.approval_rows([pending], {"agents"}, NOW)
    assert 'maxlength="4096"' in form and 'value="Approved"' in form and 'value="Denied"' in form


def test_the_status_says_what_was_delivered() -> None:
    delivery = {"branch": "corral/s", "revision": "ab" * 20, "state": "Delivered"}
    page = pages.session_page("me", _session(delivery=delivery), [], [], False, NOW)
    assert '<span id="delivered"><code>abababababab</code> on <code>corral/s</code>' in page
    assert 'id="changes" class="changes" data-revision="' + "ab" * 20 + '"' in page
    none = pages.session_page("me", _session(), [], [], False, NOW)
    assert '<span id="delivered"><span class="muted">nothing yet</span>' in none
