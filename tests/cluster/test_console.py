"""The console's read API on the real API server (docs/console.md): people by bearer token
(TokenReview), every request authorised on its namespace (SubjectAccessReview), the live turn
read from the harness's wire, and decisions written with the person's own token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ._console_fixtures import ConsoleHandle, console, other_namespace  # noqa: F401
from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)


def _session_in(cp: Any, namespace: str, name: str, repo: Path) -> None:
    doc = session_doc(name, repo, agent="nobody")
    doc["metadata"]["namespace"] = namespace
    cp.kubectl("apply", "-f", "-", input=json.dumps(doc))


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of each Server-Sent Event in `text`."""
    found = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            found.append((fields["event"], json.loads(fields["data"])))
    return found


@pytest.fixture
def unserved_ns(operator: OperatorHandle, console: ConsoleHandle) -> Iterator[str]:  # noqa: F811
    """A namespace alice may read (the viewer role bound there) that the console does not
    serve: the operator watches the other two only."""
    cp, name = operator.cp, f"{console.other}-u"
    cp.create_namespace(name)
    cp.kubectl(
        "create", "rolebinding", "alice-views", "-n", name,
        f"--clusterrole=corral-{operator.namespace}-viewer",
        f"--serviceaccount={console.namespace}:alice",
    )  # fmt: skip
    yield name
    cp.release_namespace(name)


def test_people_read_only_the_namespaces_rbac_gives_them(
    operator: OperatorHandle,
    console: ConsoleHandle,  # noqa: F811
    git_repo: Path,
    unserved_ns: str,
) -> None:
    cp = operator.cp
    operator.apply(agent_doc(), session_doc("visible", git_repo))
    _session_in(cp, console.other, "elsewhere", git_repo)
    operator.wait_phase("visible", {"Succeeded"})

    # Nobody, or a token the API server does not accept: 401, and the pages send to sign-in.
    with console.client(None) as anon:
        refused = anon.get("/api/v1/sessions")
        assert refused.status_code == 401 and refused.json()["error"] == "unauthenticated"
        page = anon.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login"
    with console.client("not-a-token") as forged:
        assert forged.get("/api/v1/sessions").status_code == 401

    with console.client(console.alice) as alice:
        assert alice.get("/api/v1/whoami").json()["username"] == (
            f"system:serviceaccount:{console.namespace}:alice"
        )
        names = [s["metadata"]["name"] for s in alice.get("/api/v1/sessions").json()["items"]]
        assert names == ["visible"]
        view = alice.get(f"/api/v1/namespaces/{console.namespace}/sessions/visible").json()
        assert view["session"]["status"]["phase"] == "Succeeded"
        assert view["mayDecide"] is True
        assert "$" in view["fragments"]["cost"]
        fleet = alice.get("/").text
        assert "visible" in fleet and "elsewhere" not in fleet and console.other not in fleet
        # Another namespace: 403 with the reason, and nothing of it.
        other = alice.get(f"/api/v1/namespaces/{console.other}/sessions/elsewhere")
        assert other.status_code == 403 and "elsewhere" not in other.text
        assert other.json() == {
            "error": "forbidden",
            "reason": f"system:serviceaccount:{console.namespace}:alice may not get sessions "
            f"in namespace {console.other}",
        }
        stream = alice.get(f"/api/v1/namespaces/{console.other}/sessions/elsewhere/events")
        assert stream.status_code == 403

        # Where she may read, an unknown Session is 404: its page, its JSON, its stream (no
        # stream starts) and its changes; an unknown Approval too, and a path the console
        # does not serve, in the console's own {error, reason}.
        base = f"/api/v1/namespaces/{console.namespace}/sessions/nope"
        for path in (base, f"{base}/events", f"{base}/changes"):
            missing = alice.get(path)
            assert missing.status_code == 404, path
            assert missing.json() == {"error": "not_found",
                "reason": f"session nope not found in namespace {console.namespace}"}  # fmt: skip
        page = alice.get(f"/ns/{console.namespace}/sessions/nope")
        assert page.status_code == 404 and "text/html" in page.headers["content-type"]
        decision = alice.post(
            f"/api/v1/namespaces/{console.namespace}/approvals/nope/decision",
            json={"decision": "Approved"},
        )
        assert decision.status_code == 404 and decision.json()["error"] == "not_found"
        nowhere = alice.get("/api/v1/nothing-here")
        assert nowhere.status_code == 404 and nowhere.json()["error"] == "not_found"
        # A namespace she may read that this console does not serve: nothing it shows, 404
        # (not the console identity's own 403, which named the operator's ServiceAccount).
        unserved = alice.get(f"/api/v1/namespaces/{unserved_ns}/sessions/anything")
        assert unserved.status_code == 404 and "serviceaccount" not in unserved.text.lower()

    with console.client(console.mallory) as mallory:
        names = [s["metadata"]["name"] for s in mallory.get("/api/v1/sessions").json()["items"]]
        assert names == ["elsewhere"]
        for path in (
            f"/api/v1/namespaces/{console.namespace}/sessions/visible",
            f"/api/v1/namespaces/{console.namespace}/sessions/visible/events",
            f"/ns/{console.namespace}/sessions/visible",
            # Not there at all: still 403, so a guess tells her nothing of what exists.
            f"/api/v1/namespaces/{console.namespace}/sessions/nope",
            f"/api/v1/namespaces/{console.namespace}/sessions/nope/changes",
        ):
            answer = mallory.get(path)
            assert answer.status_code == 403, path
            assert "Say that the task is done" not in answer.text
        approvals = mallory.get("/api/v1/approvals").json()["items"]
        assert all(a["metadata"]["namespace"] == console.other for a in approvals)


def test_the_live_turn_streams_from_the_harness_wire(
    operator: OperatorHandle,
    console: ConsoleHandle,  # noqa: F811
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
) -> None:
    name = f"{operator.namespace}-live"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"text": "Looking.", "tool_use": {"name": "bash",
                                                     "input": {"command": "echo STREAMED"}}},
                    {"text": "All done."},
                ]
            }
        }
    )  # fmt: skip
    operator.apply(agent_doc(), session_doc(name, git_repo, keepSandbox=True))
    operator.wait_phase(name, {"Succeeded"})
    with console.client(console.alice) as alice:
        answer = alice.get(f"/api/v1/namespaces/{console.namespace}/sessions/{name}/events")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = _sse(answer.text)
    kinds = [data.get("type") for event, data in events if event == "wire"]
    assert "tool_start" in kinds and "tool_end" in kinds and kinds[-1] == "settled", kinds
    tool_end = next(d for e, d in events if d.get("type") == "tool_end")
    assert "STREAMED" in tool_end["result"]
    assert events[-1][0] == "end" and "Succeeded" in events[-1][1]["reason"]
    # Resuming after an offset (the browser's Last-Event-ID) sends only what came after it.
    last = max(int(d["offset"]) for e, d in events if e == "wire")
    with console.client(console.alice) as alice:
        again = alice.get(
            f"/api/v1/namespaces/{console.namespace}/sessions/{name}/events",
            headers={"Last-Event-ID": str(last)},
        )
    resumed = [d for e, d in _sse(again.text) if e == "wire"]
    assert [int(d["offset"]) for d in resumed] == [last]


def test_a_decision_is_written_with_the_persons_own_token(
    operator: OperatorHandle,
    console: ConsoleHandle,  # noqa: F811
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
) -> None:
    """A real sandbox's `git merge` asks; mallory (another namespace) cannot decide; alice
    approves through the console and the API server records her as the one who decided (the
    operator's identity has no right to approvals/status at all)."""
    name = f"{operator.namespace}-merge"
    merge = {"command": "git merge --ff-only main && echo MERGED"}
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"text": "Merging main.", "tool_use": {"name": "bash", "input": merge}},
                    {"text": "Merged."},
                ]
            }
        }
    )
    operator.apply(agent_doc(), session_doc(name, git_repo))
    operator.wait_phase(name, {"WaitingForHuman"})
    with console.client(console.alice) as alice:
        view = alice.get(f"/api/v1/namespaces/{console.namespace}/sessions/{name}").json()
    (approval,) = view["approvals"]
    target = f"/api/v1/namespaces/{console.namespace}/approvals/{approval['metadata']['name']}"
    with console.client(console.mallory) as mallory:
        refused = mallory.post(f"{target}/decision", json={"decision": "Approved"})
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    with console.client(console.alice) as alice:
        bad = alice.post(f"{target}/decision", json={"decision": "Maybe"})
        assert bad.status_code == 400 and "Approved, Denied" in bad.json()["reason"]
        cross_site = alice.post(
            f"{target}/decision",
            data={"decision": "Approved"},
            headers={"Origin": "https://evil.example"},
        )
        assert cross_site.status_code == 403
        too_long = alice.post(f"{target}/decision",
                              json={"decision": "Approved", "reason": "x" * 4097})  # fmt: skip
        assert too_long.status_code == 400 and "4096" in too_long.json()["reason"]
        done = alice.post(f"{target}/decision", json={"decision": "Approved", "reason": "ok"})
        assert done.status_code == 200, done.text
        # The reason is the Approval's, and both pages show it with the decision.
        for page in ("/approvals", f"/ns/{console.namespace}/sessions/{name}"):
            shown = alice.get(page).text
            assert "Approved by system:serviceaccount:" in shown, page
            assert '<q class="comment">ok</q>' in shown, page
        again = alice.post(f"{target}/decision", json={"decision": "Denied"})
        assert again.status_code == 409 and again.json()["error"] == "already_decided"
    status = (operator.get("approval", approval["metadata"]["name"]) or {})["status"]
    assert status["decision"] == "Approved" and status["comment"] == "ok"
    assert status["decidedBy"] == f"system:serviceaccount:{console.namespace}:alice"
    assert operator.wait_phase(name, {"Succeeded", "Failed"})["phase"] == "Succeeded"
    wait_for("the session's approval listed as decided", lambda: "Approved" in str(
        operator.get("approval", approval["metadata"]["name"])))  # fmt: skip


def test_corral_console_acts_with_the_kubeconfig_of_the_person_running_it(
    control_plane: Any, namespace: str, git_repo: Path, tmp_path: Path
) -> None:
    """`corral console` on a workstation: the person is the kubeconfig's user, and the API
    server (SelfSubjectAccessReview, then the reads themselves) decides what it shows."""
    import subprocess
    import sys

    import httpx

    from corral_dev import controlplane, stack

    release = f"corral-{namespace}"
    stack.install_rbac(control_plane, release, namespace)
    _session_in(control_plane, namespace, "mine", git_repo)
    control_plane.kubectl(
        "create", "rolebinding", "carol-views", "-n", namespace,
        f"--clusterrole={release}-viewer", "--user=carol",
    )  # fmt: skip
    kubeconfig = control_plane.user_kubeconfig("carol", ["system:authenticated"])
    port = controlplane.free_port()
    log = tmp_path / "console.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "corral_cli.main", "console", "--kubeconfig", str(kubeconfig),
             "-n", namespace, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        stack.wait_serving("corral console", f"{url}/healthz", process, log)
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/api/v1/whoami").json()["username"] == "carol"
            items = client.get("/api/v1/sessions").json()["items"]
            assert [s["metadata"]["name"] for s in items] == ["mine"]
            assert "mine" in client.get("/").text
            assert client.get("/api/v1/namespaces/kube-system/sessions/x").status_code == 403
            view = client.get(f"/api/v1/namespaces/{namespace}/sessions/mine").json()
            assert view["mayDecide"] is False  # a viewer, not an approver
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_who_may_patch_a_session_suspends_and_resumes_it_from_its_page(
    operator: OperatorHandle,
    console: ConsoleHandle,  # noqa: F811
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
) -> None:
    """The Suspend buttons show only to a person whose RBAC lets them patch Sessions there,
    and the console writes spec.suspend with that person's own token: alice (viewer, approver)
    is refused until a role lets her patch sessions."""
    name = f"{operator.namespace}-park"
    merge = {"command": "git merge --ff-only main && echo MERGED"}
    scripted_model.load({"conversations": {name: [
        {"text": "Merging main.", "tool_use": {"name": "bash", "input": merge}},
        {"text": "Merged."},
    ]}})  # fmt: skip
    operator.apply(agent_doc(), session_doc(name, git_repo))
    operator.wait_phase(name, {"WaitingForHuman"})
    page, ns = f"/ns/{console.namespace}/sessions/{name}", console.namespace
    target = f"/api/v1/namespaces/{ns}/sessions/{name}/suspend"
    with console.client(console.alice) as alice:
        assert 'value="suspendNow"' not in alice.get(page).text
        refused = alice.post(target, json={"suspend": True})
        assert refused.status_code == 403 and "may not patch sessions" in refused.json()["reason"]
    operator.cp.kubectl("create", "role", "session-patcher", "-n", ns,
                        "--resource=sessions.corral.dev", "--verb=patch")  # fmt: skip
    operator.cp.kubectl("create", "rolebinding", "alice-patches", "-n", ns,
                        "--role=session-patcher", f"--serviceaccount={ns}:alice")  # fmt: skip
    with console.client(console.alice) as alice:
        wait_for("the Suspend buttons", lambda: 'value="suspendNow"' in alice.get(page).text, 15)
        bad = alice.post(target, json={"suspend": True, "mode": "later"})
        assert bad.status_code == 400 and "afterTurn, now" in bad.json()["reason"]
        done = alice.post(target, json={"suspend": True, "mode": "now"})
        assert done.status_code == 200, done.text
    spec = (operator.get("session", name) or {})["spec"]
    assert (spec["suspend"], spec["suspendMode"]) == (True, "now")
    # The turn held at its Approval is aborted (mode now). Without an archive (this operator
    # has none) the pod stays, idle; nothing is admitted.
    parked = operator.wait_phase(name, {"Suspended"}, timeout=60)
    assert parked["lastSettlement"]["error"].startswith("suspend:"), parked
    assert parked["suspendedFrom"] == "Running" and "no archive" in parked["message"]
    with console.client(console.alice) as alice:
        assert 'value="resume"' in alice.get(page).text
        form = alice.post(f"{page}/suspend", data={"action": "resume"},
                          headers={"Origin": console.url}, follow_redirects=False)  # fmt: skip
        assert form.status_code == 303, form.text
    assert (operator.get("session", name) or {})["spec"]["suspend"] is False
    back = operator.wait_phase(name, {"Running", "WaitingForHuman", "Succeeded"}, timeout=60)
    assert back.get("suspendedFrom") is None
