"""A finished Session is still readable in the console after its sandbox pod is gone, and
after the Session itself is gone, from the archive in S3-compatible object storage (docs/
console.md, docs/history.md).

The real operator runs under the chart's RBAC with `--archive-s3-*` pointing at moto's S3
server (tests/_moto_s3.py: a STAND-IN for S3 that checks every SigV4 signature), its archive
reader and its console. alice may read the namespace (the chart's viewer role); the console
and the archive reader (`corral logs`, `corral describe`) show her the same archived record.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_dev import controlplane, stack
from corral_dev.controlplane import ControlPlane
from corral_operator.archive.s3 import S3Archive

from .._moto_s3 import MotoS3, moto_s3
from ._console_fixtures import person_token
from ._node_fixtures import LocalNodeHandle
from ._operator_fixtures import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    identity_kubeconfig,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)
BUCKET = "corral-history"


@dataclass
class Stack:
    operator: OperatorHandle
    s3: MotoS3
    console: str
    reader: str
    alice: str


@pytest.fixture
def history(
    control_plane: ControlPlane,
    namespace: str,
    local_node: LocalNodeHandle,
    scripted_model: ScriptedModelHandle,
) -> Iterator[Stack]:
    release = f"corral-{namespace}"
    stack.install_rbac(control_plane, release, namespace)
    kubeconfig = identity_kubeconfig(control_plane, OPERATOR_NAMESPACE, OPERATOR_SA)
    health, reader, console = (controlplane.free_port() for _ in range(3))
    work = Path(tempfile.mkdtemp(prefix="corral-operator-"))
    credentials = work / "s3-credentials"
    credentials.mkdir()
    with moto_s3(credentials, BUCKET) as s3:
        args = stack.operator_args(
            control_plane, kubeconfig=kubeconfig, namespaces=[namespace], health_port=health,
            model_url=scripted_model.url, wire_wait_seconds=5,
        )  # fmt: skip
        args += [
            "--archive-s3-endpoint", s3.url, "--archive-s3-bucket", BUCKET,
            "--archive-s3-prefix", "audit", "--archive-s3-credentials-dir", str(credentials),
            "--archive-listen", f"127.0.0.1:{reader}", "--console-addr", f"127.0.0.1:{console}",
        ]  # fmt: skip
        handle = OperatorHandle(control_plane, namespace, kubeconfig, args, work / "operator.log",
                                node=local_node)  # fmt: skip
        handle.start()
        try:
            for what, port in (("the operator", health), ("the console", console)):
                stack.wait_serving(what, f"http://127.0.0.1:{port}/healthz", handle.process,
                                   handle.log)  # fmt: skip
            alice = person_token(control_plane, namespace, "alice", f"{release}-viewer")
            yield Stack(handle, s3, f"http://127.0.0.1:{console}", f"http://127.0.0.1:{reader}",
                        alice)  # fmt: skip
        finally:
            handle.stop()
            with contextlib.suppress(Exception):
                control_plane.kubectl("delete", "sessions", "--all", "-n", namespace,
                                      "--wait=false", check=False)  # fmt: skip


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


def test_a_finished_session_whose_pod_is_gone_is_read_in_the_console(
    history: Stack, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    op, name = history.operator, "kept-history"
    echo = {"tool_use": {"name": "bash", "input": {"command": "echo from-the-archive"}}}
    scripted_model.load({"conversations": {name: [echo, {"text": "Archived and done."}]}})
    op.apply(agent_doc("hist-coder", loop="reactive"), session_doc(name, git_repo, "hist-coder"))
    assert op.wait_phase(name, {"Succeeded", "Failed"})["phase"] == "Succeeded"
    wait_for("the pod to go", lambda: op.get("pod", f"corral-{name}") is None, 90)
    uid = op.get("session", name)["metadata"]["uid"]  # type: ignore[index]

    # The archive is in the bucket, written by the operator with its SigV4 keys.
    store = S3Archive(history.s3.url, BUCKET, "us-east-1", history.s3.credentials, prefix="audit")
    archived = store.read(op.namespace, name, uid)
    assert archived is not None and archived.record["cause"] == "finished"

    console = httpx.Client(base_url=history.console, timeout=30,
                           headers={"Authorization": f"Bearer {history.alice}"})  # fmt: skip
    base = f"/api/v1/namespaces/{op.namespace}/sessions/{name}"
    view = console.get(base).json()
    assert view["archive"]["cause"] == "finished"
    assert [r["status"] for r in view["archive"]["receipts"]] == ["completed"]
    assert 'class="receipt status-completed"' in view["fragments"]["receipts"]
    page = console.get(f"/ns/{op.namespace}/sessions/{name}")
    assert page.status_code == 200 and 'class="receipts"' in page.text

    # The turn, from the archive at the wire's offsets; and from an offset on, as on a resume.
    events = _sse(console.get(f"{base}/events").text)
    assert ("state", {"state": "archived"}) in events and events[-1][0] == "end"
    wire = [data for kind, data in events if kind == "wire"]
    assert [e["offset"] for e in wire] == [e["offset"] for e in archived.events]
    assert any(e["type"] == "tool_end" and "from-the-archive" in str(e.get("result"))
               for e in wire)  # fmt: skip
    later = [d for k, d in _sse(console.get(f"{base}/events?offset=2").text) if k == "wire"]
    assert [e["offset"] for e in later] == [e["offset"] for e in archived.events_from(2)]

    # The CLI's path (the archive reader) reads the same archive from the same store.
    reader = httpx.get(f"{history.reader}/v1/namespaces/{op.namespace}/sessions/{name}/transcript",
                       headers={"Authorization": f"Bearer {history.alice}"}).json()  # fmt: skip
    assert reader["source"] == "archive" and reader["events"] == wire

    # The Session goes (as its TTL would delete it): the console shows it from the record.
    op.cp.kubectl("delete", "session", name, "-n", op.namespace, "--wait=true", "--timeout=60s")
    gone = console.get(base)
    assert gone.status_code == 200, gone.text
    assert gone.json()["session"]["status"]["phase"] == "Succeeded"
    assert gone.json()["session"]["metadata"]["uid"] == uid
    events = _sse(console.get(f"{base}/events").text)
    assert [d for k, d in events if k == "wire"] == wire
    assert events[-1] == ("end", {"reason": "the session is gone"})

    # Without access, nothing of it: not the page, not the archived turn.
    nobody = httpx.get(f"{history.console}{base}/events", timeout=30,
                       headers={"Authorization": "Bearer not-a-token"})  # fmt: skip
    assert nobody.status_code == 401 and "from-the-archive" not in nobody.text
    assert console.get(f"/api/v1/namespaces/{op.namespace}/sessions/never").status_code == 404
