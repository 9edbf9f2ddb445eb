"""`corral console --state DIR` over real HTTP against a real `corral run` (docs/console.md):
the run waits at its `git merge` for a person (`--approvals manual`); the console lists the run,
shows the pending approval, a person approves it there, the run lands and finishes, and the
console shows its transcript, its receipts and the decision. Real processes throughout: the
run's harness, custodian and scripted model, and the console's uvicorn."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from corral_dev import controlplane

from .conftest import EXAMPLES, corral_argv, git, run_env

pytestmark = pytest.mark.timeout(180)
SCENARIO = EXAMPLES / "demo" / "scenario-land.yaml"
T = TypeVar("T")


def _until(what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


@pytest.fixture
def run_and_console(
    tmp_path: Path, demo_workspace: Path
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    state = tmp_path / "xdg-state" / "corral" / "runs" / "land"
    state.parent.mkdir(parents=True)
    # A git copy of the demo repository: the run's commits land on its branch there.
    run = subprocess.Popen(
        [*corral_argv(), "run", "-f", str(EXAMPLES / "session.yaml"), "--workspace",
         str(demo_workspace), "--scenario", str(SCENARIO), "--approvals", "manual", "--json",
         "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(), cwd=tmp_path,
    )  # fmt: skip
    port = controlplane.free_port()
    # No kubeconfig applies here (HOME without ~/.kube, no $KUBECONFIG): the state home is shown.
    env = {**run_env(), "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "xdg-state")}
    env.pop("KUBECONFIG", None)
    console = subprocess.Popen(
        [*corral_argv(), "console", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _until("the console", lambda: _serving(url, console), 30)
        yield run, url, state
    finally:
        for proc in (console, run):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _serving(url: str, proc: subprocess.Popen[str]) -> bool:
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_person_approves_a_local_run_in_the_console(
    run_and_console: tuple[subprocess.Popen[str], str, Path],
    demo_workspace: Path,
) -> None:
    run, url, state = run_and_console
    http = httpx.Client(base_url=url, timeout=30)

    def pending() -> list[dict[str, Any]]:
        items = http.get("/api/v1/approvals").json()["items"]
        return [a for a in items if a["status"]["decision"] == "Pending"]

    (asked,) = _until("the run to ask for its merge", pending, 90)
    # The run is shown by its Session's name (metadata.name), not its directory's ("land").
    assert asked["spec"]["sessionRef"]["name"] == "fix-discount"
    assert "git merge --ff-only fix/discount" in json.dumps(asked["spec"]["action"])
    fleet = http.get("/")
    assert fleet.status_code == 200 and 'data-session="fix-discount"' in fleet.text
    assert 'data-session="land"' not in fleet.text
    page = http.get("/approvals")
    assert f'data-approval="{asked["metadata"]["name"]}"' in page.text and "Approve" in page.text
    # No sign-in here: the person is whoever runs the command.
    assert "Sign out" not in fleet.text and "Sign out" not in page.text
    login = http.get("/login", follow_redirects=False)
    assert login.status_code == 303 and login.headers["location"] == "/"
    view = http.get("/api/v1/namespaces/local/sessions/fix-discount").json()
    assert view["session"]["status"]["phase"] not in ("Succeeded", "Failed")

    decision = f"/api/v1/namespaces/local/approvals/{asked['metadata']['name']}/decision"
    cross_site = http.post(decision, json={"decision": "Approved"},
                           headers={"Origin": "http://evil.example"})  # fmt: skip
    assert cross_site.status_code == 403 and cross_site.json()["error"] == "forbidden"
    bad = http.post(decision, json={"decision": "Maybe"})
    assert bad.status_code == 400 and bad.json()["error"] == "bad_request"
    done = http.post(decision, json={"decision": "Approved", "reason": "looks right"})
    assert done.status_code == 200, done.text
    assert done.json()["approval"]["status"]["decision"] == "Approved"
    again = http.post(decision, json={"decision": "Denied"})
    assert again.status_code == 409 and again.json()["error"] == "already_decided"
    missing = http.post("/api/v1/namespaces/local/approvals/apr_0000000000000000/decision",
                        json={"decision": "Approved"})  # fmt: skip
    assert missing.status_code == 404

    # The decision is the file store's, bound to the request, and the run goes on and lands.
    (record,) = [json.loads(p.read_text()) for p in (state / "custodian" / "approvals").glob("*")]
    assert record["decision"] == "approved" and "corral console" in record["decidedBy"]
    assert record["comment"] == "looks right"  # the reason typed is stored with the decision
    _, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    workspace = demo_workspace  # the run's branch is in the repository it was given
    assert git(workspace, "rev-parse", "corral/fix-discount") == git(
        workspace, "rev-parse", "fix/discount"
    )

    # The finished run: its phase, its receipts, and its transcript at the wire's offsets.
    view = http.get("/api/v1/namespaces/local/sessions/fix-discount").json()
    assert view["session"]["status"]["phase"] == "Succeeded"
    assert view["archive"]["receipts"] and view["archive"]["receipts"][-1]["status"] == (
        "completed"
    )
    session_page = http.get("/ns/local/sessions/fix-discount").text
    assert 'class="receipts"' in session_page and "Sign out" not in session_page
    assert '<q class="comment">looks right</q>' in session_page
    # What the run committed on its branch, read from the repository it committed to.
    tip = git(workspace, "rev-parse", "corral/fix-discount").strip()
    assert view["delivered"] == tip
    changes = http.get("/api/v1/namespaces/local/sessions/fix-discount/changes").json()
    assert changes["changes"]["revision"] == tip, changes
    patch = "".join(t["patch"] for t in changes["changes"]["turns"])
    assert "+    discount = subtotal * discount_percent / 100" in patch
    assert 'data-path="shop/pricing.py"' in changes["html"] and 'class="d-add"' in changes["html"]
    events = _sse(http.get("/api/v1/namespaces/local/sessions/fix-discount/events").text)
    wire = [d for k, d in events if k == "wire"]
    assert [e["offset"] for e in wire] == list(range(len(wire)))
    assert any(e["type"] == "approval_requested" for e in wire)
    merge = next(e for e in wire if e["type"] == "tool_start" and "git merge" in json.dumps(e))
    assert any(e["type"] == "tool_end" and e.get("toolUseId") == merge["toolUseId"]
               for e in wire)  # fmt: skip
    assert events[-1] == ("end", {"reason": "the session is Succeeded"})
    assert http.get("/api/v1/namespaces/local/sessions/nope").status_code == 404


def test_state_mode_refuses_a_missing_directory_and_a_public_address(tmp_path: Path) -> None:
    missing = subprocess.run([*corral_argv(), "console", "--state", str(tmp_path / "nope")],
                             capture_output=True, text=True, env=run_env(), timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    public = subprocess.run(
        [*corral_argv(), "console", "--state", str(tmp_path), "--address", "0.0.0.0"],
        capture_output=True, text=True, env=run_env(), timeout=60,
    )  # fmt: skip
    assert public.returncode == 2 and "loopback address only" in public.stderr
