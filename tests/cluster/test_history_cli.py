"""History that outlives the pod, and the CLI that reads it, on the real API server, operator
and local node (docs/history.md, docs/cli.md).

The operator runs under the chart's RBAC with an archive directory and its archive reader.
People are service accounts of the test namespace with tokens from the API server's
TokenRequest: `reader` may read Corral's kinds there, `outsider` may not. Every `corral`
command runs as a real process with the person's kubeconfig.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev import controlplane, stack
from corral_dev.controlplane import ControlPlane

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

CORRAL = [sys.executable, "-m", "corral_cli.main"]
READER_RULES = {
    "apiGroups": ["corral.dev"],
    "resources": ["sessions", "goals", "evidences", "approvals"],
    "verbs": ["get", "list", "watch"],
}


@dataclass
class Archiving:
    operator: OperatorHandle
    archive_dir: Path
    reader_url: str
    reader: Path  # kubeconfig of a person who may read the namespace's sessions
    outsider: Path  # kubeconfig of a person with no role there

    def corral(
        self, *args: str, kubeconfig: Path | None = None, timeout: float = 60, direct: bool = True
    ) -> Any:
        """`corral ARGS` as the person; `direct`: the reader at its URL, else (no
        $CORRAL_ARCHIVE_URL) through the API server's service proxy as `--archive-service`
        says."""
        env = {**os.environ, "CORRAL_ARCHIVE_URL": self.reader_url}
        env.pop("KUBECONFIG", None)
        if not direct:
            env.pop("CORRAL_ARCHIVE_URL")
        cmd = [*CORRAL, *args, "--kubeconfig", str(kubeconfig or self.reader)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _routable_address() -> str:
    """This host's address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("198.51.100.1", 9))
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), f"no routable address for the reader: {address}"
    return address


def _token_kubeconfig(cp: ControlPlane, namespace: str, account: str) -> Path:
    cp.kubectl("create", "serviceaccount", account, "-n", namespace)
    token = cp.kubectl("create", "token", account, "-n", namespace).stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cp.server,
                                               "certificate-authority": str(cp.ca_file)}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account,
                                               "namespace": namespace}}],
        "current-context": "c",
    }  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="corral-person-")) / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def archiving(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    namespace: str,
    local_node: LocalNodeHandle,
    scripted_model: ScriptedModelHandle,
) -> Iterator[Archiving]:
    stack.install_rbac(control_plane, f"corral-{namespace}", namespace)
    kubeconfig = identity_kubeconfig(control_plane, OPERATOR_NAMESPACE, OPERATOR_SA)
    health, port = controlplane.free_port(), controlplane.free_port()
    work = Path(tempfile.mkdtemp(prefix="corral-operator-"))
    args = stack.operator_args(
        control_plane,
        kubeconfig=kubeconfig,
        namespaces=[namespace],
        health_port=health,
        model_url=scripted_model.url,
        wire_wait_seconds=5,
    )
    archive = work / "archive"
    if getattr(request, "param", None) == "unwritable":
        archive.write_text("a file where the archive's directory should be\n")
        args += ["--archive-deadline-seconds", "3"]
    # A routable address, not loopback: the API server's service proxy dials it too (an
    # Endpoints address may not be loopback).
    host = _routable_address()
    args += ["--archive-dir", str(archive), "--archive-listen", f"{host}:{port}"]
    handle = OperatorHandle(control_plane, namespace, kubeconfig, args, work / "operator.log",
                            node=local_node)  # fmt: skip
    handle.start()
    reader = _token_kubeconfig(control_plane, namespace, "reader")
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "corral-reader", "namespace": namespace},
         "rules": [READER_RULES,
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "corral-reader", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "corral-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]},
    ]))  # fmt: skip
    outsider = _token_kubeconfig(control_plane, namespace, "outsider")
    try:
        stack.wait_serving("the operator", f"http://127.0.0.1:{health}/healthz", handle.process,
                           handle.log)  # fmt: skip
        yield Archiving(handle, archive, f"http://{host}:{port}", reader, outsider)
    finally:
        handle.stop()
        with contextlib.suppress(Exception):
            control_plane.kubectl("delete", "sessions", "--all", "-n", namespace,
                                  "--wait=false", check=False)  # fmt: skip


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def test_a_finished_session_is_read_after_its_pod_is_gone(
    archiving: Archiving, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    op, name = archiving.operator, "hist-done"
    echo = {"tool_use": {"name": "bash", "input": {"command": "echo archived-hello"}}}
    scripted_model.load({"conversations": {name: [echo, {"text": "Done, said hello."}]}})
    op.apply(agent_doc("hist-coder", loop="reactive"), session_doc(name, git_repo, "hist-coder"))
    status = op.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status

    # The pod goes only after the archive: the condition says so, the pod is gone.
    archived = wait_for("the Archived condition", lambda: _condition(op.session_status(name),
                                                                     "Archived"))  # fmt: skip
    assert (archived["status"], archived["reason"]) == ("True", "Archived"), archived
    wait_for("the pod to go", lambda: op.get("pod", f"corral-{name}") is None, 60)
    uid = op.get("session", name)["metadata"]["uid"]  # type: ignore[index]
    run = archiving.archive_dir / op.namespace / name / uid
    record = json.loads((run / "record.json").read_text())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert record["format"] == "corral.dev/archive/v1" and record["cause"] == "finished"
    assert record["session"]["status"]["phase"] == "Succeeded"
    assert [e["offset"] for e in events] == list(range(len(events)))
    assert record["receipts"][0]["receipt"]["toolsRun"] == ["bash"]
    assert any(e["type"] == "tool_end" and "archived-hello" in str(e.get("result"))
               for e in events)  # fmt: skip

    # describe: from the API server and the archive, the pod being gone.
    described = archiving.corral("describe", "session", name)
    assert described.returncode == 0, described.stderr
    out = described.stdout
    assert "Phase:         Succeeded" in out
    assert "Archived" in out and "SandboxReleased" in out  # the condition and the Event
    assert f"{len(events)} wire events, 1 settled (archive" in out, out
    assert "tools: bash" in out and "ledger: success via reactive" in out

    # logs: the same lines `corral run` prints, from the archive.
    logs = archiving.corral("logs", name)
    assert logs.returncode == 0, logs.stderr
    assert "▶ bash echo archived-hello" in logs.stdout
    assert "assistant: Done, said hello." in logs.stdout
    as_json = archiving.corral("logs", name, "--json")
    assert [json.loads(line)["offset"] for line in as_json.stdout.splitlines()] == [
        e["offset"] for e in events
    ]

    # Someone without access to the namespace reads nothing, neither live nor archived.
    refused = archiving.corral("logs", name, kubeconfig=archiving.outsider)
    assert refused.returncode == 2 and "403" in refused.stderr, refused.stderr
    assert "archived-hello" not in refused.stdout
    described = archiving.corral("describe", "session", name, kubeconfig=archiving.outsider)
    assert described.returncode == 2 and "forbidden" in described.stderr.lower()

    # get: the table, -o json / yaml / wide, and -A with the admin's kubeconfig.
    table = archiving.corral("get", "sessions")
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["NAME", "AGENT", "PHASE", "TURNS", "RESTARTS", "OUTCOME", "FROZEN",
                              "WAKES", "AGE"]  # the CRD's printer columns  # fmt: skip
    row = next(r.split() for r in rows if r.startswith(name))
    assert row[1:6] == ["hist-coder", "Succeeded", "1", "0", "success"]
    listed = json.loads(archiving.corral("get", "sessions", "-o", "json").stdout)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == [name]
    one = yaml.safe_load(archiving.corral("get", "session", name, "-o", "yaml").stdout)
    assert one["status"]["phase"] == "Succeeded"
    wide = archiving.corral("get", "sess", "-o", "wide").stdout.splitlines()
    assert "POD" in wide[0].split() and f"corral-{name}" in wide[1]
    every = archiving.corral("get", "sessions", "-A", kubeconfig=op.cp.kubeconfig)
    assert every.stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert any(line.split()[:2] == [op.namespace, name] for line in every.stdout.splitlines())
    missing = archiving.corral("get", "session", "nope")
    assert missing.returncode == 2 and "not found" in missing.stderr


@pytest.mark.parametrize("archiving", ["unwritable"], indirect=True)
def test_a_failing_archive_holds_the_pod_only_until_its_deadline(
    archiving: Archiving, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    op, name = archiving.operator, "hist-broken"
    scripted_model.load({"conversations": {name: [{"text": "Done."}]}})
    op.apply(agent_doc("broken-coder"), session_doc(name, git_repo, "broken-coder"))
    status = op.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    failed = wait_for("the Archived condition", lambda: _condition(op.session_status(name),
                                                                   "Archived"), 60)  # fmt: skip
    assert (failed["status"], failed["reason"]) == ("False", "ArchiveFailed"), failed
    assert "the pod goes anyway" in failed["message"]
    wait_for("the pod to go", lambda: op.get("pod", f"corral-{name}") is None, 60)
    # Events are posted asynchronously and stamped to the second: their presence is what counts.
    wanted = {"ArchiveFailed", "SandboxReleased"}
    wait_for("both Events", lambda: wanted <= {e["reason"] for e in op.events(name)}, 30)
    # Nothing archived, and the reader says why rather than showing half a record.
    logs = archiving.corral("logs", name)
    assert logs.returncode == 2 and logs.stdout == "", (logs.stdout, logs.stderr)
    assert "(503) archive_unavailable: the archive cannot be read" in logs.stderr


class _Followed:
    """A process whose output is read as it comes, each stream through its pipe's one buffered
    reader on a thread. `readline()` then `communicate()` loses what readline had buffered
    past its line (communicate reads the raw pipe): the lines a follower printed together
    with its first, one page's worth."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env)  # fmt: skip
        self._lines: list[str] = []
        self._errors: list[str] = []
        self._came = threading.Condition()
        self._ended = False
        self._readers = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_errors, daemon=True)]  # fmt: skip
        for reader in self._readers:
            reader.start()

    def _read_out(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._came:
                self._lines.append(line)
                self._came.notify_all()
        with self._came:
            self._ended = True
            self._came.notify_all()

    def _read_errors(self) -> None:
        assert self.process.stderr is not None
        self._errors.append(self.process.stderr.read())

    def __enter__(self) -> _Followed:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for reader in self._readers:
            reader.join(10)

    def first_line(self, timeout: float) -> str:
        with self._came:
            self._came.wait_for(lambda: self._lines or self._ended, timeout)
            return self._lines[0] if self._lines else ""

    def output(self, timeout: float) -> tuple[str, str]:
        """Everything it printed on stdout and on stderr, once it has ended."""
        self.process.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        with self._came:
            return "".join(self._lines), "".join(self._errors)


def test_a_followed_process_keeps_the_lines_printed_with_its_first() -> None:
    # One write of three lines, then one more: what a follower prints for a page, then the next.
    child = "import time; print('one\\ntwo\\nthree', flush=True); time.sleep(0.3); print('four')"
    with _Followed([sys.executable, "-c", child], dict(os.environ)) as followed:
        assert followed.first_line(timeout=30) == "one\n"
        assert followed.output(timeout=30) == ("one\ntwo\nthree\nfour\n", "")


def test_logs_follow_a_live_session_to_its_end(
    archiving: Archiving, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    op, name = archiving.operator, "hist-live"
    slow = {"delay": 2.0, "tool_use": {"name": "bash", "input": {"command": "echo step-one"}}}
    # The second answer comes late enough that a `corral logs -f` started on a busy machine
    # still finds the turn running.
    scripted_model.load({"conversations": {name: [slow, {"delay": 8.0, "text": "All done."}]}})
    op.apply(agent_doc("live-coder", loop="reactive"), session_doc(name, git_repo, "live-coder"))
    op.wait_phase(name, {"Running"}, timeout=90)
    env = {**os.environ, "CORRAL_ARCHIVE_URL": archiving.reader_url}
    env.pop("KUBECONFIG", None)
    logs = [*CORRAL, "logs", name, "-f", "--kubeconfig", str(archiving.reader)]
    started = time.monotonic()
    with _Followed(logs, env) as follow, _Followed([*logs, "--json"], env) as as_json:
        first = follow.first_line(timeout=90)
        first_at = time.monotonic() - started
        phase_at_first = op.session_status(name).get("phase")
        text, err = follow.output(timeout=120)
        json_text, json_err = as_json.output(timeout=120)
    assert follow.process.returncode == 0, err
    assert as_json.process.returncode == 0, json_err
    status = op.session_status(name)
    assert status["phase"] == "Succeeded", status
    # It streamed while the turn ran (its first line came while the Session was still
    # running, before the model's second answer), and it read everything up to the end.
    assert phase_at_first == "Running", (phase_at_first, first_at, text)
    assert first and text.startswith(first), (first, text)
    assert "▶ bash echo step-one" in text and "assistant: All done." in text, text
    lines = ["route: ", "▶ bash echo step-one", "  ◀ ok: ", "assistant: All done.",
             "ledger: success"]  # fmt: skip
    assert [text.count(line) for line in lines] == [1] * len(lines), text
    assert [text.index(line) for line in lines] == sorted(text.index(line) for line in lines)
    # Every event once, in order, across the live pages and the switch to the archive.
    *events, note = [json.loads(line) for line in json_text.splitlines()]
    assert [e["offset"] for e in events] == list(range(len(events))), json_text
    assert events[-1]["type"] == "settled", events[-1]
    assert note == {"type": "note", "text": f"session {name}: Succeeded ({len(events)} events)"}
    assert f"session {name}: Succeeded ({len(events)} events)" in text


def _serve_reader_through_its_service(
    control_plane: ControlPlane, namespace: str, reader_url: str, people: list[str]
) -> str:
    """The chart's reader Service and its `archive-proxy` Role (bound to `people`, service
    accounts of `namespace`), with the Service's endpoint at the test's operator process: a
    stand-in Pod object (on no node) carries its address, as the API server checks an
    endpoint's pod before it proxies. Returns the Service as NAMESPACE/NAME."""
    release = f"corral-{namespace}"
    host, port = reader_url.removeprefix("http://").rsplit(":", 1)
    subjects = [{"kind": "ServiceAccount", "name": p, "namespace": namespace} for p in people]
    # The chart's values as documented: the bound people, and the API server's address let
    # through the operator's NetworkPolicy (the local plane enforces none; the render checks
    # the value's shape).
    docs = stack.render_chart(control_plane, release, namespace, **{
        "archive.proxySubjects": subjects,
        "console.allowedFrom": [{"ipBlock": {"cidr": "127.0.0.1/32"}}],
    })  # fmt: skip
    proxy_rbac = [d for d in docs if d["metadata"]["name"] == f"{release}-archive-proxy"]
    assert [d["kind"] for d in proxy_rbac] == ["Role", "RoleBinding"], proxy_rbac
    rules = proxy_rbac[0]["rules"]
    only = {"apiGroups": [""], "resources": ["services/proxy"],
            "resourceNames": [f"{release}-archive:archive"], "verbs": ["get"]}  # fmt: skip
    assert rules == [only], rules
    stack.apply_docs(control_plane, proxy_rbac)
    pod = f"{release}-operator-stand-in"
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": OPERATOR_NAMESPACE},
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "operator",
                                                             "image": "none"}]},
    }))  # fmt: skip
    control_plane.kubectl("patch", "pod", pod, "-n", OPERATOR_NAMESPACE, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {
                              "podIP": host, "podIPs": [{"ip": host}]}}))  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": f"{release}-archive", "namespace": OPERATOR_NAMESPACE},
        "subsets": [{"addresses": [{"ip": host, "targetRef": {
            "kind": "Pod", "namespace": OPERATOR_NAMESPACE, "name": pod}}],
                     "ports": [{"name": "archive", "port": int(port)}]}],
    }))  # fmt: skip
    return f"{OPERATOR_NAMESPACE}/{release}-archive"


def test_logs_through_the_api_servers_service_proxy_with_the_kubeconfig_alone(
    archiving: Archiving,
    control_plane: ControlPlane,
    namespace: str,
    scripted_model: ScriptedModelHandle,
    git_repo: Any,
) -> None:
    op, name = archiving.operator, "hist-proxied"
    echo = {"tool_use": {"name": "bash", "input": {"command": "echo proxied-hello"}}}
    scripted_model.load({"conversations": {name: [echo, {"text": "Done through the proxy."}]}})
    # `outsider` may reach the reader through the proxy but not get Sessions: the reader's
    # review of the token in Corral's header refuses it. `stranger` may not even reach it.
    service = _serve_reader_through_its_service(
        control_plane, namespace, archiving.reader_url, ["reader", "outsider"]
    )
    stranger = _token_kubeconfig(control_plane, namespace, "stranger")
    via = ("--archive-service", service)
    op.apply(agent_doc("proxied-coder", loop="reactive"),
             session_doc(name, git_repo, "proxied-coder"))  # fmt: skip

    # Followed through the proxy from the start to the end (long polls through the API server).
    followed = archiving.corral("logs", name, "-f", *via, direct=False, timeout=150)
    assert followed.returncode == 0, followed.stderr
    assert "▶ bash echo proxied-hello" in followed.stdout, followed.stdout
    assert "assistant: Done through the proxy." in followed.stdout
    assert f"session {name}: Succeeded" in followed.stdout
    described = archiving.corral("describe", "session", name, *via, direct=False)
    assert described.returncode == 0 and "wire events, 1 settled" in described.stdout, described

    refused = archiving.corral("logs", name, *via, kubeconfig=archiving.outsider, direct=False)
    assert refused.returncode == 2, refused
    assert "proxied-hello" not in refused.stdout
    assert "refused (403) forbidden: you may not get sessions/" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 2, refused.stderr

    barred = archiving.corral("logs", name, *via, kubeconfig=stranger, direct=False)
    assert barred.returncode == 2 and "proxied-hello" not in barred.stdout, barred
    assert "refused (403)" in barred.stderr and "services/proxy" in barred.stderr, barred.stderr
    assert "archive-proxy Role" in barred.stderr and "Traceback" not in barred.stderr

    # No such Service (the default name where the chart is not installed as `corral`), asked
    # by the admin (a client certificate authenticates to the API server, `--token` is what
    # the reader would review): what to check, in two lines.
    missing = archiving.corral("logs", name, "--archive-service", "corral-system/nope",
                               "--token", "unused", kubeconfig=control_plane.kubeconfig,
                               direct=False)  # fmt: skip
    assert missing.returncode == 2 and "refused (404)" in missing.stderr, missing.stderr
    assert "--archive-service" in missing.stderr and len(missing.stderr.splitlines()) <= 2


def test_tree_get_goals_and_evidence(control_plane: ControlPlane, namespace: str) -> None:
    def session(name: str, parent: str | None, phase: str, cost: float) -> None:
        spec: dict[str, Any] = {"agentRef": "a", "task": "t", "workspace": {"repo": "r"}}
        if parent:
            spec["parentRef"] = {"name": parent}
        doc = {"apiVersion": "corral.dev/v1alpha1", "kind": "Session",
               "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        status = {"status": {"phase": phase, "turns": 2, "usage": {"cost": cost}}}
        control_plane.kubectl("patch", "session", name, "-n", namespace, "--subresource=status",
                              "--type=merge", "-p", json.dumps(status))  # fmt: skip

    session("root", None, "WaitingForChildren", 0.5)
    session("kid-a", "root", "Succeeded", 0.25)
    session("kid-b", "root", "Running", 0.125)
    session("grandkid", "kid-b", "Running", 0.0625)
    session("stranger", None, "Succeeded", 0)
    kubeconfig = control_plane.kubeconfig

    def corral(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        cmd = [*CORRAL, *args, "-n", namespace, "--kubeconfig", str(kubeconfig)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)

    tree = corral("tree", "root")
    assert tree.returncode == 0, tree.stderr
    lines = tree.stdout.splitlines()
    assert lines[0] == "root  WaitingForChildren  turns 2  $0.5000"
    assert [line.strip("│├└─ ") .split()[0] for line in lines] == [
        "root", "kid-a", "kid-b", "grandkid"
    ]  # fmt: skip
    assert lines[3].index("grandkid") > lines[2].index("kid-b")  # one level deeper
    nested = json.loads(corral("tree", "root", "-o", "json").stdout)
    assert [c["name"] for c in nested["children"]] == ["kid-a", "kid-b"]
    assert nested["children"][1]["children"][0]["name"] == "grandkid"
    assert corral("tree", "nobody").returncode == 2

    goal = {"apiVersion": "corral.dev/v1alpha1", "kind": "Goal",
            "metadata": {"name": "green", "namespace": namespace},
            "spec": {"description": "make it green",
                     "success": {"name": "unit", "command": "make test"},
                     "sessionTemplate": {"spec": {"agentRef": "a", "task": "t",
                                                  "workspace": {"repo": "r"}}},
                     "maxWaves": 4}}  # fmt: skip
    sha = "a" * 40
    evidence = {"apiVersion": "corral.dev/v1alpha1", "kind": "Evidence",
                "metadata": {"name": "unit-aaaa", "namespace": namespace},
                "spec": {"repo": "https://example.invalid/r.git", "revision": sha,
                         "check": "unit", "command": "make test"}}  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([goal, evidence]))
    control_plane.kubectl("patch", "goal", "green", "-n", namespace, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {"waves": 1,
                          "verdict": "Pending", "session": "green-1"}}))  # fmt: skip
    passed = json.dumps({"status": {"verdict": "Pass", "exitCode": 0}})
    control_plane.kubectl("patch", "evidence", "unit-aaaa", "-n", namespace,
                          "--subresource=status", "--type=merge", "-p", passed)  # fmt: skip
    goals = corral("get", "goals").stdout.splitlines()
    assert goals[0].split() == ["NAME", "WAVES", "MAX", "VERDICT", "SESSION", "AGE"]
    assert goals[1].split()[:5] == ["green", "1", "4", "Pending", "green-1"]
    found = corral("get", "evidence").stdout.splitlines()
    assert found[0].split() == ["NAME", "REVISION", "CHECK", "VERDICT", "AGE"]
    assert found[1].split()[:4] == ["unit-aaaa", sha, "unit", "Pass"]
    repo = corral("get", "ev", "-o", "custom-columns=REPO:.spec.repo,EXIT:.status.exitCode")
    assert repo.stdout.splitlines()[1].split() == ["https://example.invalid/r.git", "0"]
    bad = corral("get", "widgets")
    assert bad.returncode == 2 and "unknown kind" in bad.stderr
    broken = subprocess.run([*CORRAL, "get", "sessions", "--kubeconfig", "/nonexistent"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert broken.returncode == 2 and "error" in broken.stderr
