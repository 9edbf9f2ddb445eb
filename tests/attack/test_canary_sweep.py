"""The canary sweep itself: the suite's Sessions hold live canary credentials, the sweep finds
a canary planted in each kind of place it reads, in each form the redactor knows and in each
encoding the issue names, and, after the whole suite, it finds nothing.

The planting tests use canaries of their own (never the suite's), so what they plant cannot
fail the sweep after each test or the final one; they still clean up.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import yaml

from corral_dev.controlplane import ControlPlane

from ..cluster._node_fixtures import TEST_REPOS, LocalNodeHandle
from ..cluster._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)
from ._canary import (
    GIT_CREDENTIAL,
    HOOK_SECRET,
    MEMORY_DSN,
    MODEL_KEY,
    Canary,
    Finding,
    Places,
    Sweep,
    encoding_labels,
    login_canary,
    report,
)
from .conftest import CANARY_HOOK, Canaries, HookCalls

pytestmark = pytest.mark.timeout(240)


def _own_canaries(tag: str) -> list[Canary]:
    """Canaries of this test, with characters that every encoding changes (`/+= &`)."""
    hex_ = secrets.token_hex(6)
    model = f"canary-{tag}/model+key={hex_} &"
    hook = f"canary-{tag}-hook/{hex_}+="
    return [
        Canary.plain(MODEL_KEY, model),
        login_canary(GIT_CREDENTIAL, f"https://{tag}-user:canary-{tag}-git-{hex_}@git.example"),
        Canary.plain(HOOK_SECRET, hook),
        login_canary(MEMORY_DSN, f"postgresql://{tag}:canary-{tag}-pw-{hex_}@db.example/m"),
    ]


def _found(findings: list[Finding], where: str) -> set[tuple[str, str]]:
    """(canary, form), the form in any context, of the findings whose place starts with
    `where`."""
    return {(f.canary, f.form) for f in findings if f.where.startswith(where)}


def _planted(sweep: Sweep) -> set[tuple[str, str]]:
    return {(f.canary, f.text) for f in sweep.scanner.forms if not f.variant}


def _blob(sweep: Sweep) -> str:
    """Every form of every canary (as the redactor knows them), one a line."""
    forms = [f.text for f in sweep.scanner.forms if not f.variant]
    return "\n".join(["Say that the task is done.", *forms])


def _git(*args: str, cwd: Path | None = None, input: str | None = None) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def own_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace no operator watches: what the test writes there stays as written."""
    name = f"canary-self-{secrets.token_hex(4)}"
    control_plane.create_namespace(name)
    yield name
    control_plane.release_namespace(name)


def test_the_suites_sessions_hold_live_canaries_and_the_sweep_finds_each_planted_leak(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
    control_plane: ControlPlane,
    local_node: LocalNodeHandle,
    own_namespace: str,
    canaries: Canaries,
    canary_hook_server: HookCalls,
    canary_places: Places,
) -> None:
    sweep = Sweep(_own_canaries("self"), canary_places)
    planted = _planted(sweep)
    blob = _blob(sweep)
    fake_pod = local_node.workdir / "pods" / f"{own_namespace}_leaky_{secrets.token_hex(4)}"
    remote = TEST_REPOS / f"{own_namespace}.git"
    try:
        # 1. A real Session whose task carries every form: through the operator, the
        # harness, the custodian and the model into the API server, the model's requests,
        # the console and the archive.
        name = "leaky"
        scripted_model.load({"conversations": {name: [{"text": "Done."}]}})
        operator.apply(agent_doc(), session_doc(name, git_repo, task=blob))
        pod = wait_for("the sandbox pod", lambda: operator.get("pod", f"corral-{name}"), 60)
        status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=120)
        assert status["phase"] == "Succeeded", status
        archive = canary_places.archives[0] / operator.namespace / name
        wait_for("the archive", lambda: list(archive.glob("*/record.json")) or None, 60)

        # 2. What a person with the API server's admin credentials writes: a Session's
        # status, an Event, a Pod's termination message.
        kubectl = control_plane.kubectl
        docs = [
            agent_doc("planted") | {"metadata": {"name": "planted", "namespace": own_namespace}},
            session_doc("planted", git_repo, agent="planted")
            | {"metadata": {"name": "planted", "namespace": own_namespace}},
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "planted", "namespace": own_namespace},
                # Bound to no node, so nothing runs it.
                "spec": {
                    "nodeName": "canary-nowhere",
                    "containers": [{"name": "c", "image": "none", "command": ["true"]}],
                },
            },
        ]
        kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        kubectl(
            "patch", "session", "planted", "-n", own_namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"message": blob}}),
        )  # fmt: skip
        terminated = {"exitCode": 1, "reason": "Error", "message": blob}
        container = {"name": "c", "image": "none", "imageID": "", "ready": False,
                     "restartCount": 0, "state": {"terminated": terminated}}  # fmt: skip
        kubectl(
            "patch", "pod", "planted", "-n", own_namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"containerStatuses": [container]}}),
        )  # fmt: skip
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "planted.1", "namespace": own_namespace},
            "involvedObject": {"kind": "Session", "name": "planted", "namespace": own_namespace},
            "reason": "Planted",
            "message": blob[:1000],  # an Event's message is cut at 1 KiB
            "type": "Warning",
        }
        kubectl("apply", "-f", "-", input=json.dumps(event))

        # 3. The local node's files: a container's log, the workspace, the tools' and the
        # harness's /tmp, a home; and, not to be counted, the custodian's own volume and
        # home, and a symlink the agent could plant to it.
        for relative in ("logs/custodian.log", "volumes/workspace/notes.txt",
                         "volumes/tools-tmp/x", "volumes/harness-tmp/y", "home/tools/z",
                         "volumes/model-key/key", "home/custodian/own"):  # fmt: skip
            (fake_pod / relative).parent.mkdir(parents=True, exist_ok=True)
            (fake_pod / relative).write_text(f"before\n{blob}\nafter\n")
        (fake_pod / "volumes/workspace/link").symlink_to(fake_pod / "volumes/model-key/key")

        # 4. The remote: a commit carrying every form, a branch named after a canary and an
        # object no ref reaches.
        git_token = next(c for c in sweep.canaries if c.name == GIT_CREDENTIAL).secret
        _git("init", "-q", "--bare", "-b", "main", str(remote))
        work = remote.with_suffix(".work")
        _git("clone", "-q", str(remote), str(work))
        (work / "notes.txt").write_text(blob)
        _git("add", "notes.txt", cwd=work)
        _git("commit", "-qm", "notes", cwd=work)
        _git(
            "push",
            "-q",
            "origin",
            "HEAD:refs/heads/main",
            f"HEAD:refs/heads/leak/{git_token}",
            cwd=work,
        )
        shutil.rmtree(work)
        loose = _git(
            "--git-dir", str(remote), "hash-object", "-w", "--stdin", input=blob + "\nloose"
        )

        findings = sweep.run()
    finally:
        sweep.close()
        shutil.rmtree(fake_pod, ignore_errors=True)
        shutil.rmtree(remote, ignore_errors=True)

    text = report(findings, title="the planted canaries")
    # It read something of every kind of place (the live turn's stream included).
    assert all(sweep.read.values()), sweep.read
    assert len(planted) >= 4 * 10, planted  # every canary, in many forms
    ns = operator.namespace
    places = {
        f"kube Session {ns}/{name}": planted,
        "model request": planted,
        "console GET /api/v1/sessions": planted,
        f"console GET /ns/{ns}/sessions/{name}": planted,
        f"console GET /api/v1/namespaces/{ns}/sessions/{name}": planted,
        f"archive {canary_places.archives[0] / ns / name}": planted,
        f"kube Session {own_namespace}/planted": planted,
        f"kube Pod {own_namespace}/planted": planted,
        f"file {fake_pod}/logs/custodian.log": planted,
        f"file {fake_pod}/volumes/workspace/notes.txt": planted,
        f"file {fake_pod}/volumes/tools-tmp/x": planted,
        f"file {fake_pod}/volumes/harness-tmp/y": planted,
        f"file {fake_pod}/home/tools/z": planted,
        f"git {remote} blob": planted,
        f"git {remote} refs": {(GIT_CREDENTIAL, git_token)},
    }
    label = {(f.canary, f.text): f"{f.canary}: {f.encoding}" for f in sweep.scanner.forms}
    missing = {
        where: sorted(label[pair] for pair in want - _found(findings, where))
        for where, want in places.items()
    }
    missing = {where: forms for where, forms in missing.items() if forms}
    assert not missing, f"not found: {json.dumps(missing, indent=1)}\n{text}"
    # The Event carries the first forms only (its message is cut).
    assert _found(findings, f"kube Event {own_namespace}/planted.1"), text
    # The loose object, which no ref reaches, is read too.
    assert any(f.where == f"git {remote} blob {loose}" for f in findings), text
    # The custodian's own files, and a symlink to them, are not what others read.
    for own in ("volumes/model-key", "home/custodian", "volumes/workspace/link"):
        assert not [f for f in findings if f.where.startswith(f"file {fake_pod}/{own}")], text

    # The suite's canaries are live: the custodian sent the model key to the model (the one
    # place it belongs, which the sweep does not count) and the hook secret to the hook; the
    # sandbox mounts the git credential and the memory DSN; the DSN opens the database.
    headers = [r["headers"] for r in scripted_model.requests(name)]
    assert headers and all(h.get("x-api-key") == canaries.model_key.value for h in headers)
    assert f"Bearer {canaries.hook_secret.value}" in canary_hook_server.authorizations
    agent = operator.get("agent", "coder") or {}
    assert [h["name"] for h in agent["spec"]["hooks"]["afterTurn"]] == [CANARY_HOOK]
    custodian = next(c for c in pod["spec"]["containers"] if c["name"] == "custodian")
    env = {e["name"] for e in custodian.get("env") or []}
    assert {"CORRAL_MODEL_KEY_FILE", "CORRAL_GIT_CREDENTIALS_FILE", "CORRAL_HOOK_SECRET_DIR",
            "CORRAL_MEMORY_DSN_FILE"} <= env, env  # fmt: skip
    checkout = next(c for c in pod["spec"]["initContainers"] if c["name"] == "checkout")
    assert any(m["name"] == "git-credentials" for m in checkout["volumeMounts"]), checkout
    wire = operator.get("secret", f"corral-{name}-wire") or {}
    dsn = base64.b64decode(wire["data"]["memory-dsn"]).decode().strip()
    assert dsn == canaries.memory_dsn.value
    _connects(dsn)


def _connects(dsn: str) -> None:
    """The memory DSN opens its database, unless the suite had no PostgreSQL (then its port
    is closed and the canary is only configured and mounted)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    except psycopg.OperationalError as err:
        assert "refused" in str(err), err


def _issue_encodings(canary: Canary) -> dict[str, str]:
    """Each encoding the issue names, computed here (not by the product), inside other text."""
    value = canary.secret
    raw = value.encode()
    out = {
        "plain": f"key={value};",
        "url-encoded": f"?key={quote(value, safe='')}&x=1",
        "url-encoded, lower-case escapes": "?key="
        + re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(value, safe=""))
        + "&x=1",
        "form-encoded": f"key={quote_plus(value)}&x=1",
        "hex": f"0x{raw.hex()}.",
        "HEX": f"0x{raw.hex().upper()}.",
        "json \\u escapes": '{"k": "' + "".join(f"\\u{ord(c):04x}" for c in value) + '"}',
        "json string": json.dumps({"k": value}),
    }
    for offset in range(3):
        longer = b"x" * offset + b"Authorization: " + raw + b" and more after it"
        out[f"base64 of a longer text, offset {offset}"] = base64.b64encode(longer).decode()
        out[f"base64url of a longer text, offset {offset}"] = base64.urlsafe_b64encode(
            longer
        ).decode()
    for pair in canary.pairs[:1]:
        out["user:password@"] = f"https://{pair}@elsewhere.example/repo.git"
        out["HTTP Basic"] = f"Authorization: Basic {base64.b64encode(pair.encode()).decode()}"
    return out


def test_the_sweep_finds_every_encoding_the_issue_names(tmp_path: Path) -> None:
    """Files with one canary in one encoding each, computed by this test: the sweep reports
    each file with its canary. (The forms the sweep searches are the product's, so this is
    also a check on the redactor's list.)"""
    own = _own_canaries("enc")
    logs = tmp_path / "pods" / "ns_pod_0000" / "logs"
    logs.mkdir(parents=True)
    planted: dict[Path, str] = {}
    for canary in own:
        for index, (label, text) in enumerate(_issue_encodings(canary).items()):
            path = logs / f"{canary.name}-{index}.log"
            path.write_text(f"{label}\nsome log text {text} more log text\n")
            planted[path] = canary.name
    sweep = Sweep(own, Places(None, node_workdir=tmp_path))
    try:
        findings = sweep.run()
    finally:
        sweep.close()
    missing = []
    for path, name in planted.items():
        if not any(f.where == f"file {path}" and f.canary == name for f in findings):
            missing.append(f"{name}: {path.read_text().splitlines()[0]}")
    assert not missing, "the sweep missed:\n  " + "\n  ".join(missing)
    # Its labels name the encodings it can tell.
    assert encoding_labels("abc12345")[base64.b64encode(b"abc12345").decode()] == "base64"


def test_the_suites_sweep_reports_a_leak_of_a_suite_canary_once(
    canary_sweep: Sweep, canaries: Canaries, local_node: LocalNodeHandle
) -> None:
    """The sweep that runs after each test searches the suite's own canaries: a suite canary
    in a container's log is reported, once (a later test does not fail for it again), and no
    more once it is gone (so the final sweep would pass)."""
    pod = local_node.workdir / "pods" / f"canary-once_leaky_{secrets.token_hex(4)}"
    log = pod / "logs" / "custodian.log"
    log.parent.mkdir(parents=True)
    encoded = base64.b64encode(canaries.hook_secret.value.encode()).decode()
    try:
        log.write_text(f"hook answered; sent Authorization: {encoded}\n")
        first = canary_sweep.new_findings()
        again = canary_sweep.new_findings()
    finally:
        shutil.rmtree(pod)
    text = report(first, title="the first sweep")
    assert {(f.where, f.canary) for f in first} == {(f"file {log}", HOOK_SECRET)}, text
    assert "base64" in {f.encoding for f in first}, text
    assert again == []
    assert not [f for f in canary_sweep.run() if str(pod) in f.where]


def test_no_canary_anywhere_after_the_whole_suite(canary_sweep: Sweep) -> None:
    """Runs after every other test of the suite (conftest moves it last): the whole sweep,
    every place from the start of the run, finds nothing."""
    findings = canary_sweep.run()
    assert not findings, report(findings, title="canary sweep after the whole suite")
