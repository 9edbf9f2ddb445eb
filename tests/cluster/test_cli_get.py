"""`corral get` and `corral describe` for every kind against the real local API server
(docs/cli.md): one object of each kind in a namespace, read back as a real `corral` process with
the admin's kubeconfig through -o name/json/jsonpath/custom-columns, -l, -A, --no-headers, and
-w (a status change made while it watches shows up as a row); `describe` shows each kind's
fields, conditions and Events."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral_dev.controlplane import ControlPlane

pytestmark = pytest.mark.timeout(240)

CORRAL = [sys.executable, "-c", "import sys; from corral_cli.main import main; sys.exit(main())"]
API = "/apis/corral.dev/v1alpha1"
REVISION = "49d4c101f7f1c1eb59425ef9ba181c121ff53639"


def _objects(namespace: str) -> list[dict[str, Any]]:
    def doc(kind: str, name: str, spec: dict[str, Any], **labels: str) -> dict[str, Any]:
        meta = {"name": name, "namespace": namespace, "labels": {"team": "blue", **labels}}
        return {"apiVersion": "corral.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}

    return [
        doc("Agent", "coder", {"identity": "you code", "model": "claude-sonnet-4-5",
                               "loop": "reactive"}),
        doc("Session", "fix", {"agentRef": "coder", "task": "fix the test",
                               "workspace": {"repo": "https://git.invalid/r.git"}}, tier="one"),
        doc("Session", "other", {"agentRef": "coder", "task": "another",
                                 "workspace": {"repo": "https://git.invalid/r.git"}}),
        doc("Goal", "green", {"description": "green tests", "maxWaves": 2,
                              "success": {"name": "tests", "command": "true"},
                              "sessionTemplate": {"spec": {"agentRef": "coder", "task": "t",
                                  "workspace": {"repo": "https://git.invalid/r.git"}}}}),
        doc("Evidence", "ev1", {"repo": "https://git.invalid/r.git", "revision": REVISION,
                                "check": "unit", "command": "true"}),
        doc("Approval", "apr1", {"sessionRef": {"name": "fix", "uid": "u-1"},
                                 "action": {"tool": "land", "arguments": "{}",
                                            "digest": "sha256:" + "0" * 64},
                                 "reason": "landing asks"}),
        doc("Freeze", "hold", {"scope": {"agent": "coder"}, "reason": "rollout"}),
    ]  # fmt: skip


@pytest.fixture
def seeded(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    for obj in _objects(namespace):
        control_plane.apply_object(obj)
    _status(control_plane, namespace, "sessions", "fix", {"phase": "Running", "turns": 1})
    control_plane.api_send("POST", f"/api/v1/namespaces/{namespace}/events", {
        "metadata": {"name": "green.1", "namespace": namespace},
        "involvedObject": {"kind": "Goal", "name": "green", "namespace": namespace,
                           "apiVersion": "corral.dev/v1alpha1"},
        "type": "Normal", "reason": "WaveStarted", "message": "wave 1 of 2",
        "source": {"component": "corral-operator"},
        "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip
    yield namespace


def _status(cp: ControlPlane, namespace: str, plural: str, name: str, status: Any) -> None:
    cp.api_send("PATCH", f"{API}/namespaces/{namespace}/{plural}/{name}/status",
                {"status": status}, "application/merge-patch+json")  # fmt: skip


def _corral(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run([*CORRAL, *args, "--kubeconfig", str(cp.kubeconfig)],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


KIND_ROWS = {
    "sessions": ("session.corral.dev", ["fix", "other"]),
    "agents": ("agent.corral.dev", ["coder"]),
    "goals": ("goal.corral.dev", ["green"]),
    "approvals": ("approval.corral.dev", ["apr1"]),
    "evidence": ("evidence.corral.dev", ["ev1"]),
    "freezes": ("freeze.corral.dev", ["hold"]),
}


@pytest.mark.parametrize("kind", list(KIND_ROWS))
def test_get_every_kind_in_every_output(
    control_plane: ControlPlane, seeded: str, kind: str
) -> None:
    prefix, names = KIND_ROWS[kind]
    ns = ["-n", seeded]
    table = _corral(control_plane, "get", kind, *ns)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("NAME ") and lines[0].rstrip().endswith("AGE")
    assert [line.split()[0] for line in lines[1:]] == names
    plain = _corral(control_plane, "get", kind, *ns, "--no-headers").stdout.splitlines()
    assert [line.split()[0] for line in plain] == names  # the rows alone, no NAME header
    named = _corral(control_plane, "get", kind, *ns, "-o", "name").stdout.split()
    assert named == [f"{prefix}/{n}" for n in names]
    listed = json.loads(_corral(control_plane, "get", kind, *ns, "-o", "json").stdout)
    assert listed["kind"] == "List"
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == names
    path = _corral(control_plane, "get", kind, *ns, "-o", "jsonpath={.items[*].metadata.name}")
    assert sorted(path.stdout.split()) == names
    custom = _corral(
        control_plane,
        "get",
        kind,
        names[0],
        *ns,
        "-o",
        "custom-columns=N:.metadata.name,TEAM:.metadata.labels.team,X:.nope",
    )
    assert custom.stdout.splitlines()[1].split() == [names[0], "blue", "<none>"]


def test_get_columns_selector_and_all_namespaces(control_plane: ControlPlane, seeded: str) -> None:
    ns = ["-n", seeded]
    sessions = _corral(control_plane, "get", "cs", *ns).stdout.splitlines()
    assert sessions[0].split() == ["NAME", "AGENT", "PHASE", "TURNS", "RESTARTS", "OUTCOME",
                                   "FROZEN", "WAKES", "AGE"]  # fmt: skip
    assert sessions[1].split()[:4] == ["fix", "coder", "Running", "1"]
    wide = _corral(control_plane, "get", "sessions", *ns, "-o", "wide").stdout.splitlines()[0]
    assert "POD" in wide.split() and "REVISION" in wide.split()
    only = _corral(control_plane, "get", "sessions", *ns, "-l", "tier=one", "-o", "name")
    assert only.stdout.split() == ["session.corral.dev/fix"]
    agents = _corral(control_plane, "get", "ag", "-A").stdout.splitlines()
    assert agents[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert [seeded, "coder", "claude-sonnet-4-5", "reactive"] in [r.split()[:4] for r in agents]
    none = _corral(control_plane, "get", "freezes", *ns, "-l", "team=red")
    assert none.returncode == 0 and none.stdout == ""
    assert "No resources found" in none.stderr
    bad = _corral(control_plane, "get", "sessions", *ns, "-o", "jsonpath={..name}")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) <= 2


def _reader(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The watching process's lines as they come, read by a thread (a selector on the pipe
    would miss lines Python has already buffered, such as the rows printed with the header)."""
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump(stream: Any) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
    return lines


def _read_until(lines: queue.Queue[str | None], want: str, deadline: float) -> list[str]:
    """Lines from the watching process until one contains `want`."""
    seen: list[str] = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if want in line:
            return seen
    raise AssertionError(f"no line with {want!r} in {seen}")


def test_get_watch_prints_a_change(control_plane: ControlPlane, seeded: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    cmd = [*CORRAL, "get", "sessions", "-n", seeded, "-w", "--kubeconfig",
           str(control_plane.kubeconfig)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        lines = _reader(proc)
        first = _read_until(lines, "other", time.monotonic() + 60)
        assert first[0].startswith("NAME")
        _status(control_plane, seeded, "sessions", "other", {"phase": "Succeeded", "turns": 3})
        changed = _read_until(lines, "Succeeded", time.monotonic() + 30)
        assert changed[-1].split()[:4] == ["other", "coder", "Succeeded", "3"]
        assert proc.poll() is None  # still watching
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize(("kind", "name", "shows"), [
    ("agent", "coder", ["Model:  claude-sonnet-4-5", "Loop:  reactive"]),
    ("session", "fix", ["Agent:         coder", "Phase:         Running"]),
    ("goal", "green", ["Max Waves:  2", "WaveStarted", "wave 1 of 2", "corral-operator"]),
    ("evidence", "ev1", [f"Revision:  {REVISION}", "Check:  unit"]),
    ("approval", "apr1", ["Tool:  land", "Reason:  landing asks"]),
    ("freeze", "hold", ["Agent:  coder", "Reason:  rollout"]),
])  # fmt: skip
def test_describe_every_kind(
    control_plane: ControlPlane, seeded: str, kind: str, name: str, shows: list[str]
) -> None:
    done = _corral(control_plane, "describe", kind, name, "-n", seeded)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Name:          {name}\nNamespace:     {seeded}")
    for text in shows:
        assert text in done.stdout
    assert "Events:" in done.stdout
    missing = _corral(control_plane, "describe", kind, "nope", "-n", seeded)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_describe_names_an_objects_conditions(control_plane: ControlPlane, seeded: str) -> None:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _status(control_plane, seeded, "agents", "coder", {"conditions": [
        {"type": "Ready", "status": "False", "reason": "NoCatalog", "message": "no model",
         "lastTransitionTime": when}]})  # fmt: skip
    done = _corral(control_plane, "describe", "ag", "coder", "-n", seeded)
    conditions = done.stdout.split("Conditions:\n", 1)[1].splitlines()
    assert conditions[1].split() == ["Ready", "False", "NoCatalog", "no", "model"]
    got = _corral(control_plane, "get", "agents", "-n", seeded, "--no-headers").stdout.split()
    # ORCHESTRATOR as the API server defaulted it, READY from the condition.
    assert got[:5] == ["coder", "claude-sonnet-4-5", "reactive", "false", "False"]
