"""Corral in real containers: the chart installed with `helm install` (the operator a pod of its
own image), Sessions applied with `kubectl apply` reaching Succeeded against the scripted
model, and the sandbox's isolation checked on the real kubelet, containerd, runc and
NetworkPolicy enforcer: each container under its own uid, read-only root filesystems, no
service-account token where none belongs, Pod Security `restricted`, and the malicious agent's
attempts (tests/attack's, with the paths a real pod has) all failing, its egress to another
sandbox and to a host outside its allowlist included.

One install and two Sessions serve the whole module: `quiet` (a plain session, kept after it
ends) and `attacker` (its shell tries everything once, with `quiet`'s address in hand). The
same tests run on kind (hack/e2e-kind.sh; see _target.py).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ..conftest import record_tier_time
from . import _corral
from ._corral import FS_GROUP, NAMESPACE, UIDS, Corral
from ._target import Target

pytestmark = pytest.mark.timeout(300)

LINE = re.compile(r"^ATTACK (?P<name>[a-z-]+) rc=(?P<rc>-?\d+) :: (?P<out>.*)$", re.M)
NO_FILE = "No such file or directory"


@pytest.fixture(scope="module")
def corral(target: Target) -> Iterator[Corral]:
    start = time.monotonic()
    with _corral.installed(target) as installed:
        record_tier_time("node", "Corral installed (helm)", time.monotonic() - start)
        yield installed


@pytest.fixture(scope="module")
def prober(corral: Corral) -> str:
    """A plain pod in the sessions' namespace, selected by no NetworkPolicy: what a probe that
    a sandbox fails does when no policy stands in its way."""
    corral.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            _corral.restricted_pod(
                "prober", NAMESPACE, corral.target.sandbox_image, ["sleep", "infinity"]
            )
        ),
    )
    corral.kubectl(
        "wait", "--for=condition=Ready", "pod/prober", "-n", NAMESPACE, "--timeout=90s",
        timeout=100,
    )  # fmt: skip
    return "prober"


@dataclass
class Quiet:
    name: str
    status: dict[str, Any]
    pod: dict[str, Any]
    ip: str


@pytest.fixture(scope="module")
def quiet(corral: Corral) -> Quiet:
    """A Session applied with kubectl: its agent runs `id` and writes to its workspace."""
    name = "quiet"
    corral.load_script(
        {
            "conversations": {
                name: [
                    {
                        "tool_use": {
                            "name": "bash",
                            "input": {"command": "id; touch /workspace/by-the-agent && echo wrote"},
                        }
                    },
                    {"text": "Done."},
                ]
            }
        }
    )
    start = time.monotonic()
    corral.apply(_corral.agent_doc(), _corral.session_doc(name, corral.git_url))
    status = corral.wait_phase(name, {"Succeeded", "Failed"})
    record_tier_time("node", "first Session to its end", time.monotonic() - start)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    pod = corral.get("pod", f"corral-{name}")
    assert pod is not None, "keepSandbox: the pod should still be there"
    return Quiet(name, status, pod, pod["status"]["podIP"])


# The attacker's one bash call: each attempt prints `ATTACK <name> rc=<exit> :: <output>`.
ATTACK = r"""
set +e
PROBE=$(cat <<'PY'
{probe}
PY
)
probe() {{ python3 -c "$PROBE" "$@"; }}
try() {{
  name=$1; shift; out=$("$@" 2>&1); rc=$?
  echo "ATTACK $name rc=$rc :: $(printf %s "$out" | head -c 300 | tr '\n' ' ')"
}}
me=$(python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')
try whoami id
try wire-token cat /var/run/corral/wire/token
try custodian-credential cat /var/run/corral/wire/custodian
try harness-state ls /var/lib/corral/state/conversations
try forge-settled sh -c 'echo x | tee -a /var/lib/corral/state/conversations/agent/log.jsonl'
try custodian-state sh -c 'ls /var/lib/corral/custodian/*'
try service-account-token cat /var/run/secrets/kubernetes.io/serviceaccount/token
try custodian-token cat /var/run/corral/kube/token
try control-variables sh -c 'env | grep ^CORRAL_ || echo none'
try root-write touch /written-by-the-agent
try workspace-write sh -c 'touch /workspace/ok && echo ok'
try model-proxy probe http "http://$me:8081/v1/messages" \
  '{{"model":"corral-scripted","max_tokens":99999,"messages":[]}}'
try menu probe http "http://$me:8081/agents/x/surface"
try push probe http "http://$me:8081/agents/x/tools/push" '{{}}'
try spawn probe http "http://$me:8081/agents/x/tools/spawn_child" '{{"task":"escape"}}'
try operator-port probe http "http://$me:8082/v1/usage"
api=https://kubernetes.default.svc/apis/corral.dev/v1alpha1
try evidence probe http "$api/namespaces/{namespace}/evidences" '{{}}'
try other-harness probe tcp {other}:8080
try other-custodian probe tcp {other}:8081
try other-custodian-operator probe tcp {other}:8082
try host-outside-allowlist probe tcp {forbidden}
try model-direct probe tcp {allowed}
try dns-public probe dns pypi.org
try dns-cluster probe dns kubernetes.default.svc.cluster.local
try api-direct probe tcp {api}:443
try model-via-gateway probe connect {allowed}
try git-via-gateway probe connect {git}
try api-via-gateway probe connect kubernetes.default.svc:443
try metadata probe connect 169.254.169.254:80
try metadata-decimal probe connect 2852039166:80
try metadata-octal probe connect 0251.0376.0251.0376:80
try metadata-mapped probe connect [::ffff:169.254.169.254]:80
try other-sandbox-via-gateway probe connect {other}:8080
try welcome probe connect {welcome}
try welcome-shouting probe connect {welcome_shouting}
try welcome-other-port probe connect {welcome_host}:{forbidden_port}
try welcome-by-address probe connect {host}:{welcome_port}
try unlisted-host probe connect pypi.org:443
"""


ATTACKER_AGENT = "attacker"


@dataclass
class Attack:
    attempts: dict[str, tuple[int, str]]
    results: list[str]
    seen: str


@pytest.fixture(scope="module")
def attack(corral: Corral, quiet: Quiet) -> Attack:
    name = "attacker"
    host, _, forbidden_port = corral.forbidden.rpartition(":")
    api = corral.kubectl(
        "get", "service", "kubernetes", "-n", "default", "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    script = ATTACK.format(
        probe=_corral.PROBE.strip(),
        namespace=NAMESPACE,
        other=quiet.ip,
        forbidden=corral.forbidden,
        allowed=corral.allowed,
        api=api,
        git=corral.git_url.removeprefix("git://").split("/", 1)[0],
        welcome=corral.welcome,
        welcome_shouting=f"{_corral.WELCOME_HOST.upper()}.:{corral.welcome_port}",
        welcome_host=_corral.WELCOME_HOST,
        forbidden_port=forbidden_port,
        host=host,
        welcome_port=corral.welcome_port,
    )
    corral.load_script(
        {
            "conversations": {
                name: [
                    {"tool_use": {"name": "bash", "input": {"command": script, "timeout": 120}}},
                    {"tool_use": {"name": "read", "input": {"path": "../../../../etc/passwd"}}},
                    {"text": "I could not get out."},
                ]
            }
        }
    )
    # Its Agent names one destination, by name and port: the gateway's only yes to it.
    agent = _corral.agent_doc(
        sandbox={"egress": [{"host": _corral.WELCOME_HOST, "ports": [corral.welcome_port]}]}
    )
    agent["metadata"]["name"] = ATTACKER_AGENT
    session = _corral.session_doc(name, corral.git_url, task="Break out.")
    session["spec"]["agentRef"] = ATTACKER_AGENT
    corral.apply(agent, session)
    status = corral.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    results = corral.tool_results(name)
    seen = "\n".join(results)
    attempts = {m["name"]: (int(m["rc"]), m["out"].strip()) for m in LINE.finditer(seen)}
    assert len(attempts) == 38, seen
    return Attack(attempts, results, seen)


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


# ------------------------------------------------------------------------------- the session


def test_a_session_applied_with_kubectl_succeeds_in_real_containers(
    corral: Corral, quiet: Quiet
) -> None:
    pod = quiet.pod
    statuses = {c["name"]: c for c in pod["status"]["containerStatuses"]}
    assert set(statuses) == {"harness", "tools", "custodian"}
    for name, status in statuses.items():
        assert status["containerID"].startswith("containerd://"), (name, status)
        assert status["ready"] or name == "harness", (name, status)
    images = {c["name"]: c["image"] for c in _containers(pod)}
    assert set(images.values()) == {corral.target.sandbox_image}, images
    operator = corral.get("pod", corral.operator_pod(), namespace=_corral.OPERATOR_NAMESPACE)
    assert operator is not None
    assert operator["spec"]["containers"][0]["image"] == corral.target.operator_image
    # The agent's command ran in the tools container, as the tools uid, in the fsGroup.
    results = corral.tool_results(quiet.name)
    assert results and results[0].startswith(f"uid={UIDS['tools']}"), results
    assert f"{FS_GROUP}" in results[0].split("groups=", 1)[1], results[0]
    assert results[0].rstrip().endswith("wrote"), results[0]


def test_each_container_runs_as_its_own_uid(corral: Corral, quiet: Quiet) -> None:
    pod = f"corral-{quiet.name}"
    for container, uid in UIDS.items():
        # The container's first process, not just what kubectl exec starts.
        status = corral.exec(pod, container, "cat", "/proc/1/status")
        assert status.returncode == 0, status.stderr
        ids = {
            line.split(":")[0]: line.split()[1:]
            for line in status.stdout.splitlines()
            if line.startswith(("Uid:", "Gid:", "Groups:"))
        }
        assert ids["Uid"] == [str(uid)] * 4, (container, ids)
        assert ids["Gid"] == [str(uid)] * 4, (container, ids)
        assert str(FS_GROUP) in ids["Groups"], (container, ids)
        others = set(UIDS.values()) - {uid}
        assert not others & {int(g) for g in ids["Groups"]}, (container, ids)


def test_the_agents_commands_cannot_reach_the_pods_secrets_or_state(
    corral: Corral, quiet: Quiet, attack: Attack
) -> None:
    a = attack.attempts
    assert a["whoami"][0] == 0 and a["whoami"][1].startswith(f"uid={UIDS['tools']}"), a["whoami"]
    # What the harness and the custodian hold is not in the tools container at all.
    for hidden in (
        "wire-token",
        "custodian-credential",
        "harness-state",
        "forge-settled",
        "custodian-state",
        "service-account-token",
        "custodian-token",
    ):
        rc, out = a[hidden]
        assert rc != 0 and NO_FILE in out, (hidden, out)
    assert a["control-variables"] == (0, "none")
    # ...while the same paths hold them in the containers they belong to (the paths are right).
    pod = "corral-attacker"
    token = corral.exec(pod, "harness", "cat", "/var/run/corral/wire/token")
    assert token.returncode == 0 and len(token.stdout.strip()) >= 32, token.stderr
    state = corral.exec(pod, "harness", "ls", "/var/lib/corral/state/conversations")
    assert state.returncode == 0 and state.stdout.strip(), state
    custodian_token = corral.exec(pod, "custodian", "cat", "/var/run/corral/kube/token")
    assert custodian_token.returncode == 0, custodian_token.stderr
    # The custodian answers nobody without the pod-local credential, on either port.
    for endpoint in ("model-proxy", "menu", "push", "spawn", "operator-port"):
        assert a[endpoint][1] == "reached HTTP401", (endpoint, a[endpoint])
    # The agent has no way to the API server at all (no DNS, no address, no rule).
    assert a["evidence"][0] != 0 and a["evidence"][1].startswith("blocked"), a["evidence"]
    # The file tools stay inside the granted root.
    assert "outside the granted root" in attack.results[-1], attack.results[-1]
    # Nothing secret crossed over, in any output.
    secrets = [*corral.secret_values("attacker"), custodian_token.stdout.strip()]
    assert all(len(s) >= 32 for s in secrets)
    for secret in secrets:
        assert secret not in attack.seen


def test_root_filesystems_are_read_only(corral: Corral, quiet: Quiet, attack: Attack) -> None:
    rc, out = attack.attempts["root-write"]
    assert rc != 0 and "Read-only file system" in out, out
    assert attack.attempts["workspace-write"] == (0, "ok")
    pod = f"corral-{quiet.name}"
    for container in UIDS:
        done = corral.exec(pod, container, "touch", "/written-by-a-test")
        assert done.returncode != 0 and "Read-only file system" in done.stderr, (container, done)
    for container in _containers(quiet.pod):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]


def test_no_service_account_token_in_harness_or_tools(corral: Corral, quiet: Quiet) -> None:
    pod = f"corral-{quiet.name}"
    assert quiet.pod["spec"]["automountServiceAccountToken"] is False
    for container in ("harness", "tools"):
        for path in ("/var/run/secrets/kubernetes.io/serviceaccount", "/var/run/corral/kube"):
            done = corral.exec(pod, container, "ls", path)
            assert done.returncode != 0 and NO_FILE in done.stderr, (container, path, done)
        mounts = corral.exec(pod, container, "cat", "/proc/self/mounts").stdout
        assert "serviceaccount" not in mounts and "/var/run/corral/kube" not in mounts
    # The custodian's is the pod's only token: projected, bound to the audience, expiring.
    token = corral.exec(pod, "custodian", "cat", "/var/run/corral/kube/token")
    assert token.returncode == 0, token.stderr
    payload = token.stdout.strip().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["aud"] == ["https://kubernetes.default.svc.cluster.local"], claims
    assert claims["exp"] - claims["iat"] <= 3600 + 60, claims
    assert claims["kubernetes.io"]["serviceaccount"]["name"] == "corral-sandbox", claims


# Each weakening alone makes a copy of the sandbox pod fail Pod Security `restricted`.
def _weaken(kind: str, spec: dict[str, Any]) -> None:
    containers = {c["name"]: c for c in spec["containers"]}
    if kind == "privilege-escalation":
        containers["tools"]["securityContext"]["allowPrivilegeEscalation"] = True
    elif kind == "root":
        containers["harness"]["securityContext"]["runAsUser"] = 0
    elif kind == "capability":
        containers["custodian"]["securityContext"]["capabilities"] = {"add": ["NET_RAW"]}
    elif kind == "unconfined-seccomp":
        spec["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    elif kind == "privileged":
        containers["tools"]["securityContext"]["privileged"] = True
        containers["tools"]["securityContext"]["allowPrivilegeEscalation"] = True
    elif kind == "host-port":
        containers["harness"]["ports"][0]["hostPort"] = 8080
    elif kind == "host-network":
        spec["hostNetwork"] = True
    elif kind == "host-path":
        spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    else:
        raise AssertionError(kind)


WEAKENINGS = (
    "privilege-escalation",
    "root",
    "capability",
    "unconfined-seccomp",
    "privileged",
    "host-network",
    "host-path",
    "host-port",
)


def test_pod_security_restricted_admits_the_sandbox_and_refuses_weakened_copies(
    corral: Corral, quiet: Quiet
) -> None:
    labels = (corral.get("namespace", NAMESPACE, namespace=NAMESPACE) or {})["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert quiet.pod["status"]["phase"] == "Running"

    def copy_with(kind: str | None) -> str:
        spec = copy.deepcopy(quiet.pod["spec"])
        spec.pop("nodeName", None)
        if kind is not None:
            _weaken(kind, spec)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"copy-{kind or 'as-built'}", "namespace": NAMESPACE},
            "spec": spec,
        }
        done = corral.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        return done.stdout + done.stderr

    assert "created (server dry run)" in copy_with(None)
    for kind in WEAKENINGS:
        answer = copy_with(kind)
        refusals = ['violates PodSecurity "restricted:latest"']
        if kind == "privileged":  # an API server run with --allow-privileged=false says so first
            refusals.append("privileged: Forbidden: disallowed by cluster policy")
        assert any(r in answer for r in refusals), (kind, answer)


def test_a_sandbox_reaches_neither_another_sandbox_nor_a_host_outside_its_allowlist(
    corral: Corral, quiet: Quiet, attack: Attack, prober: str
) -> None:
    a = attack.attempts
    for name in ("other-harness", "other-custodian", "other-custodian-operator"):
        rc, out = a[name]
        assert rc != 0 and out.startswith("blocked"), (name, out)
    rc, out = a["host-outside-allowlist"]
    assert rc != 0 and out.startswith("blocked"), out
    # No direct way out at all: not the model the custodian uses, not the API server, no DNS.
    for name in ("model-direct", "api-direct", "dns-public", "dns-cluster"):
        rc, out = a[name]
        assert rc != 0 and out.startswith("blocked"), (name, out)
    # ...and the forbidden server does answer a pod no policy selects: the policy blocked it.
    assert corral.probe(prober, "main", "tcp", corral.forbidden) == "reached"
    assert corral.probe(prober, "main", "tcp", corral.allowed) == "reached"


def test_through_the_gateway_the_agent_reaches_what_its_agent_names_and_nothing_else(
    corral: Corral, attack: Attack
) -> None:
    a = attack.attempts
    # Its one destination, by name, however the name is written.
    assert a["welcome"] == (0, "reached tunnel hello"), a["welcome"]
    assert a["welcome-shouting"] == (0, "reached tunnel hello"), a["welcome-shouting"]
    # The custodian's destinations, the cluster, the metadata address (in every spelling),
    # another sandbox, another port or the bare address of the allowed host: refused.
    for name in (
        "model-via-gateway",
        "git-via-gateway",
        "api-via-gateway",
        "metadata",
        "metadata-decimal",
        "metadata-octal",
        "metadata-mapped",
        "other-sandbox-via-gateway",
        "welcome-other-port",
        "welcome-by-address",
        "unlisted-host",
    ):
        rc, out = a[name]
        assert rc != 0 and re.match(r"refused 40[03] ", out), (name, out)
    # The refusal says what to do about it: the host, and that the Agent does not allow it.
    rc, out = a["unlisted-host"]
    assert "pypi.org:443" in out and ATTACKER_AGENT in out, out


def test_every_egress_decision_is_in_the_sessions_status_and_events(
    corral: Corral, attack: Attack
) -> None:
    def recorded() -> dict[str, Any] | None:
        egress = ((corral.get("session", "attacker") or {}).get("status") or {}).get("egress")
        hosts = (egress or {}).get("hosts") or []
        return egress if any(h["host"] == "pypi.org" for h in hosts) else None

    egress = _corral.wait_for("the attacker's egress in its status", recorded, 60)
    rows = {(h["identity"], h["host"], h["decision"]): h for h in egress["hosts"]}
    assert ("agent", "pypi.org", "denied") in rows, rows.keys()
    assert ("agent", _corral.WELCOME_HOST, "allowed") in rows, rows.keys()
    assert rows[("agent", _corral.WELCOME_HOST, "allowed")]["bytesDown"] > 0
    # The custodian's own traffic is there too: the model, through the gateway.
    model_host = corral.allowed.rpartition(":")[0]
    assert ("custodian", model_host, "allowed") in rows, rows.keys()
    assert egress["denied"] >= 11 and len(egress["hosts"]) <= 20

    def denial_events() -> list[str] | None:
        events = corral.kubectl(
            "get", "events", "-n", NAMESPACE, "--field-selector",
            "involvedObject.name=attacker,reason=EgressDenied", "-o", "json",
        )  # fmt: skip
        messages = [e["message"] for e in json.loads(events.stdout)["items"]]
        return messages if any("pypi.org:443" in m for m in messages) else None

    messages = _corral.wait_for("the EgressDenied Events", denial_events, 60)
    pypi = [m for m in messages if "pypi.org:443" in m]
    assert len(pypi) == 1 and pypi[0].startswith("The agent's connection to pypi.org:443"), pypi


def test_the_gateway_gone_egress_fails_closed_and_comes_back_with_it(
    corral: Corral, attack: Attack
) -> None:
    pod, gateway = "corral-attacker", f"{_corral.RELEASE}-egress-gateway"
    before = _restarts(corral.get("pod", pod) or {})

    def welcome() -> str:
        return corral.probe(pod, "tools", "connect", corral.welcome)

    assert welcome() == "reached tunnel hello"
    scale = ("scale", "deployment", gateway, "-n", _corral.OPERATOR_NAMESPACE)
    corral.kubectl(*scale, "--replicas=0")
    try:
        _corral.wait_for("the gateway's pods gone", lambda: not _gateway_pods(corral), 90)
        answer = welcome()
        assert answer.startswith(("blocked", "refused")), answer
    finally:
        corral.kubectl(*scale, "--replicas=2")
        corral.kubectl(
            "rollout", "status", "deployment", gateway, "-n", _corral.OPERATOR_NAMESPACE,
            "--timeout=120s", timeout=150,
        )  # fmt: skip
    _corral.wait_for("egress back", lambda: welcome() == "reached tunnel hello", 60)
    # Nothing else in the Session broke: no container restarted, the Session is as it was.
    assert _restarts(corral.get("pod", pod) or {}) == before
    assert (corral.get("session", "attacker") or {})["status"]["phase"] == "Succeeded"


def _restarts(pod: dict[str, Any]) -> dict[str, int]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {c["name"]: int(c.get("restartCount") or 0) for c in statuses}


def _gateway_pods(corral: Corral) -> list[str]:
    done = corral.kubectl(
        "get", "pods", "-n", _corral.OPERATOR_NAMESPACE, "-l",
        "app.kubernetes.io/name=corral-egress-gateway", "-o", "name",
    )  # fmt: skip
    return done.stdout.split()


def test_only_the_operator_reaches_the_harness(corral: Corral, quiet: Quiet, prober: str) -> None:
    operator = corral.operator_pod()
    for port in (8080, 8082):
        answer = corral.probe(
            operator,
            "operator",
            "http",
            f"http://{quiet.ip}:{port}/readyz",
            namespace=_corral.OPERATOR_NAMESPACE,
        )
        assert answer.startswith("reached HTTP"), (port, answer)
    for port in (8080, 8081, 8082):
        answer = corral.probe(prober, "main", "tcp", f"{quiet.ip}:{port}")
        assert answer.startswith("blocked"), (port, answer)


def test_the_sessions_proxy_credential_is_in_no_log_status_event_or_tool_result(
    corral: Corral, attack: Attack
) -> None:
    """The canary sweep over the egress gateway's credential: the attacker's Session credential,
    read from its Secret, in every form the custodian's redactor knows (whole, `custodian:`
    login, HTTP Basic, base64, URL, hex...), searched for where it could have gone."""
    from ..attack._canary import Canary, Scanner, forms_of, report

    secret = corral.get("secret", "corral-attacker-wire") or {}
    credential = base64.b64decode(secret["data"]["egress"]).decode()
    canary = Canary("egress-proxy-credential", credential, credential, (f"custodian:{credential}",))
    scanner = Scanner(forms_of([canary]))
    try:
        places: dict[str, str] = {
            "the Session": json.dumps(corral.get("session", "attacker")),
            "the tool results": "\n".join(attack.results),
            "the Events": corral.kubectl("get", "events", "-n", NAMESPACE, "-o", "json").stdout,
        }
        pod = "corral-attacker"
        for container in ("checkout", "harness", "tools", "custodian"):
            places[f"{container}'s log"] = corral.kubectl(
                "logs", pod, "-n", NAMESPACE, "-c", container, check=False
            ).stdout
        for label in ("corral-operator", "corral-egress-gateway"):
            places[f"{label}'s logs"] = corral.kubectl(
                "logs", "-n", _corral.OPERATOR_NAMESPACE, "-l", f"app.kubernetes.io/name={label}",
                "--tail=-1", "--prefix", check=False,
            ).stdout  # fmt: skip
        findings = [f for where, text in places.items() for f in scanner.scan(where, text.encode())]
        assert not findings, report(findings, title="the proxy credential leaked")
        # The sweep finds the header form it would travel in, were it to leak...
        basic = base64.b64encode(f"custodian:{credential}".encode()).decode()
        assert scanner.scan("a control", f"Proxy-Authorization: Basic {basic}".encode())
        # ...and the pod spec names it by reference only (the checkout's secretKeyRef).
        assert credential not in json.dumps(corral.get("pod", pod))
    finally:
        scanner.close()


def test_deleting_the_session_removes_the_pod(corral: Corral, quiet: Quiet, attack: Attack) -> None:
    for name in (quiet.name, "attacker"):
        assert corral.get("pod", f"corral-{name}") is not None
        corral.kubectl("delete", "session", name, "-n", NAMESPACE, "--wait=false")
    for name in (quiet.name, "attacker"):

        def gone(name: str = name) -> bool:
            return all(
                corral.get(kind, obj) is None
                for kind, obj in (("pod", f"corral-{name}"), ("session", name))
            )

        _corral.wait_for(f"Session {name} and its pod to go", gone, 60)
        # What else the Session owned goes with it (the garbage collector's work).
        for kind, obj in (("secret", f"corral-{name}-wire"), ("networkpolicy", f"corral-{name}")):

            def collected(kind: str = kind, obj: str = obj) -> bool:
                return corral.get(kind, obj) is None

            _corral.wait_for(f"{kind} {obj} to go", collected, 30)


# ------------------------------------------------------------------ delivery (symlink plants)

# Where the custodian of a real pod holds each credential it could be tricked into reading.
CUSTODIAN_FILES = {
    "model-key": "/var/run/corral/model/key",
    "git-credentials": "/var/run/corral/git/credentials",
    "service-account-token": "/var/run/corral/kube/token",
    "wire-token": "/var/run/corral/wire/token",
    "custodian-credential": "/var/run/corral/wire/custodian",
}
# (alternates target, packed-refs target) per step: every file under both plants, the last
# pair left in place for turn-end delivery.
PLANT_PAIRS = [
    ("model-key", "git-credentials"),
    ("git-credentials", "model-key"),
    ("service-account-token", "wire-token"),
    ("wire-token", "custodian-credential"),
    ("custodian-credential", "service-account-token"),
]


def test_symlinks_to_the_custodians_files_leak_nothing_through_push_or_delivery(
    corral: Corral,
) -> None:
    """tests/attack/test_symlink_delivery.py on real containers: the custodian has no
    workspace mount, the bundle is written by the tools uid, and no credential text reaches
    the tool results, Session.status, any container's log or the remote."""
    name, agent = "symlinker", "deliverer"
    model_key = "sk-ant-node-canary-" + base64.b32encode(os.urandom(15)).decode().lower()
    git_credential = "https://agent:ghp" + os.urandom(16).hex() + "@git.example.invalid"
    corral.apply(
        *(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
             "stringData": {key: value}}
            for secret, key, value in (
                ("deliverer-model", "key", model_key),
                ("deliverer-git", "credentials", git_credential + "\n"),
            )
        )
    )  # fmt: skip
    steps: list[dict[str, Any]] = []
    for i, (alternates, packed) in enumerate(PLANT_PAIRS):
        command = "\n".join(
            [
                "cd /workspace && rm -f .git/objects/info/alternates .git/packed-refs",
                f"ln -s {CUSTODIAN_FILES[alternates]} .git/objects/info/alternates",
                f"ln -s {CUSTODIAN_FILES[packed]} .git/packed-refs",
                'echo "READ $(cat .git/packed-refs 2>&1 | head -c 200)"',
                f"echo {i} > plant-{i}.txt",
                *(
                    [
                        f"git add plant-{i}.txt",
                        f"git -c user.name=a -c user.email=a@a commit -qm plant-{i} 2>&1",
                        "echo REV=$(git rev-parse HEAD)",
                    ]
                    if i < len(PLANT_PAIRS) - 1
                    else ["echo left-for-the-turn"]
                ),
            ]
        )
        steps.append({"tool_use": {"name": "bash", "input": {"command": command}}})
        if i < len(PLANT_PAIRS) - 1:
            steps.append({"tool_use": {"name": "mcp__corral__push", "input": {}}})
    steps.append({"text": "Delivered."})
    corral.load_script({"conversations": {name: steps}})
    agent_doc = _corral.agent_doc(
        tools={"allow": ["bash", "mcp__corral__push"]},
        credentials={
            "modelSecretRef": {"name": "deliverer-model", "key": "key"},
            "gitSecretRef": {"name": "deliverer-git", "key": "credentials"},
        },
    )
    agent_doc["metadata"]["name"] = agent
    session = _corral.session_doc(name, corral.git_url, task="Deliver.")
    session["spec"]["agentRef"] = agent
    corral.apply(agent_doc, session)
    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=240)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    pod = f"corral-{name}"

    # The custodian has no workspace to open: its /workspace is the image's VOLUME, a private
    # empty directory, while the tools container's holds the repository. The tools uid cannot
    # read what the links name.
    done = corral.exec(pod, "custodian", "ls", "-A", "/workspace")
    assert done.stdout.strip() == "", done
    assert corral.exec(pod, "tools", "test", "-d", "/workspace/.git").returncode == 0
    results = corral.tool_results(name)
    revisions = []
    for i in range(len(PLANT_PAIRS) - 1):
        planted, pushed = results[2 * i], results[2 * i + 1]
        assert "READ" in planted and NO_FILE in planted, planted
        revision = planted.split("REV=")[1].split()[0]
        revisions.append(revision)
        assert "pushed" in pushed and revision in pushed, pushed
    delivery = status["delivery"]
    assert delivery["state"] == "Delivered", delivery
    remote = corral.work / "repos" / "work" / "repo"
    head = subprocess.run(
        ["git", "-C", str(remote), "rev-parse", f"refs/heads/corral/{name}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert head == delivery["revision"] and head not in revisions
    objects = subprocess.run(
        ["git", "-C", str(remote), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True, check=True,
    ).stdout.decode(errors="replace")  # fmt: skip

    token = corral.exec(pod, "custodian", "cat", CUSTODIAN_FILES["service-account-token"])
    assert token.returncode == 0, token.stderr
    secrets = [model_key, git_credential, token.stdout.strip(), *corral.secret_values(name)]
    logs = [
        corral.kubectl("logs", pod, "-n", NAMESPACE, "-c", c, check=False).stdout
        for c in ("checkout", "harness", "tools", "custodian")
    ]
    operator = corral.kubectl(
        "logs", "-n", _corral.OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=corral-operator",
        "--tail", "-1", check=False,
    ).stdout  # fmt: skip
    seen = "\n".join([*results, json.dumps(corral.get("session", name)), objects, operator, *logs])
    for secret in secrets:
        for form in (secret, base64.b64encode(secret.encode()).decode(), secret.encode().hex()):
            assert form not in seen, "a credential of the custodian crossed over"


# ------------------------------------------------------------------------- warm pools


def test_a_warm_pod_adopted_behind_the_gateway_checks_out_delivers_and_keeps_the_git_host_shut(
    corral: Corral, attack: Attack
) -> None:
    """A pooled pod is unknown to the gateway until adopted; the adoption binds it (the git
    host open to the checkout alone), hands the custodian its Session's proxy credential, and
    binds it again before the first turn: the agent's shell then reaches its Agent's host, not
    the git host, and the custodian delivers through the gateway."""
    agent_name, name = "pooled", "adopted"
    git = corral.git_url.removeprefix("git://").split("/", 1)[0]
    probe = 'python3 -c "$PROBE"'
    command = "\n".join(
        [
            "PROBE=$(cat <<'PY'", _corral.PROBE.strip(), "PY", ")",
            f"echo \"GIT $({probe} connect {git} 2>&1)\"",
            f"echo \"WELCOME $({probe} connect {corral.welcome} 2>&1)\"",
            "cd /workspace && echo warm > warm.txt && git add warm.txt",
            "git -c user.name=a -c user.email=a@a commit -qm warm && echo committed",
        ]
    )  # fmt: skip
    corral.load_script(
        {
            "conversations": {
                name: [
                    {"tool_use": {"name": "bash", "input": {"command": command}}},
                    {"text": "Done warm."},
                ]
            }
        }
    )
    agent = _corral.agent_doc(
        sandbox={
            "egress": [{"host": _corral.WELCOME_HOST, "ports": [corral.welcome_port]}],
            "warmPool": {"size": 1},
        }
    )
    agent["metadata"]["name"] = agent_name
    corral.apply(agent)
    selector = f"corral.dev/pool={agent_name},app.kubernetes.io/component=pool"

    def ready_pooled() -> str | None:
        pods = json.loads(
            corral.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json").stdout
        )["items"]
        for pod in pods:
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return str(pod["metadata"]["name"])
        return None

    pooled = _corral.wait_for("a ready pooled pod", ready_pooled, 180)
    before = corral.get("pod", pooled) or {}
    # Unknown to the gateway until adopted: no label, no binding.
    assert "corral.dev/egress" not in before["metadata"].get("labels", {})
    assert "corral.dev/egress-binding" not in before["metadata"].get("annotations", {})

    session = _corral.session_doc(name, corral.git_url, task="Deliver from a warm pod.")
    session["spec"]["agentRef"] = agent_name
    corral.apply(session)
    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=240)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    if status.get("podName") != pooled:
        operator = corral.kubectl(
            "logs", "-n", _corral.OPERATOR_NAMESPACE,
            "-l", "app.kubernetes.io/name=corral-operator", "--tail", "-1", check=False,
        ).stdout  # fmt: skip
        lines = [line for line in operator.splitlines() if "adopt" in line or "pool" in line]
        pytest.fail(
            f"not adopted: {status.get('podName')}; the operator said:\n" + "\n".join(lines)
        )
    results = "\n".join(corral.tool_results(name))
    assert "GIT refused 403" in results, results  # the checkout's rule is gone
    assert "WELCOME reached tunnel hello" in results, results
    assert "committed" in results, results
    delivery = status["delivery"]
    assert delivery["state"] == "Delivered", delivery
    remote = corral.work / "repos" / "work" / "repo"
    head = subprocess.run(
        ["git", "-C", str(remote), "rev-parse", f"refs/heads/corral/{name}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert head == delivery["revision"]
    bound = json.loads(
        (corral.get("pod", pooled) or {})["metadata"]["annotations"]["corral.dev/egress-binding"]
    )
    assert bound["session"] == name and bound["checkoutRules"] == [], bound
    assert bound["credentialSha256"], bound
