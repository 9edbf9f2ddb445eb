"""A sandbox behind the egress gateway (docs/egress.md): its NetworkPolicy allows the gateway
alone (no DNS), the pod carries the binding the gateway reads (the custodian credential's
SHA-256, never the credential), the tools get the proxy without a credential, and the
credential is mounted in the custodian alone."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Any

import pytest

from corral_api.kinds import EgressRule, Evidence
from corral_operator import naming
from corral_operator.builders import egress
from corral_operator.builders._pod_layout import (
    EGRESS_CREDENTIAL_ENV,
    EGRESS_CREDENTIAL_KEY,
    EGRESS_DIR,
)
from corral_operator.builders.evidencepod import build_evidence_manifests
from corral_operator.builders.podbuilder import build_sandbox
from corral_operator.main import parse_args, settings_from
from corral_operator.settings import (
    EgressGateway,
    EgressTarget,
    GatewayServiceError,
    OperatorSettings,
    gateway_from_service,
)
from tests._objects import agent, session

GATEWAY = EgressGateway(
    address="198.19.0.40",
    port=3128,
    namespace="corral-system",
    pod_labels={"app.kubernetes.io/name": "corral-egress-gateway"},
)
SETTINGS = OperatorSettings(
    image="corral/sandbox:test",
    model_upstream_url="https://api.anthropic.com",
    kube_api_url="https://kubernetes.default.svc",
    platform_egress=(EgressTarget(host="mirror.internal", ports=(8443,)),),
    egress_gateway=GATEWAY,
)
EGRESS_CREDENTIAL = "e" * 43
PYPI = [{"host": "pypi.org"}, {"host": "*.pythonhosted.org", "ports": [443]}]
HOOK = {"name": "audit", "http": {"url": "https://hooks.example:8443/audit"}}


def _manifests(**agent_spec: Any) -> Any:
    spec: dict[str, Any] = {"sandbox": {"egress": PYPI}, **agent_spec}
    return build_sandbox(
        agent(**spec),
        session(workspace={"repo": "https://git.example/team/repo.git", "ref": "main"}),
        SETTINGS,
        "w" * 43,
        "c" * 43,
        egress_credential=EGRESS_CREDENTIAL,
    )


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _binding(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(pod["metadata"]["annotations"][naming.ANNOTATION_EGRESS_BINDING]))


def test_the_policy_allows_the_gateway_alone_and_no_dns() -> None:
    policy = _manifests().network_policy
    assert policy["spec"]["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "corral-system"}
                    },
                    "podSelector": {
                        "matchLabels": {"app.kubernetes.io/name": "corral-egress-gateway"}
                    },
                }
            ],
            "ports": [{"protocol": "TCP", "port": 3128}],
        }
    ]


def test_without_a_gateway_the_policy_keeps_cidr_rules_and_dns() -> None:
    plain = OperatorSettings(platform_egress=(EgressTarget(cidr="192.0.2.1/32", ports=(443,)),))
    manifests = build_sandbox(
        agent(sandbox={"egress": [{"host": "pypi.org"}, {"cidr": "203.0.113.0/24"}]}),
        session(),
        plain,
        "w" * 43,
        "c" * 43,
        egress_credential=EGRESS_CREDENTIAL,
    )
    rules = manifests.network_policy["spec"]["egress"]
    cidrs = [r["to"][0].get("ipBlock", {}).get("cidr") for r in rules]
    assert cidrs == [None, "192.0.2.1/32", "203.0.113.0/24"]  # DNS first; the host rule: none
    assert naming.ANNOTATION_EGRESS_BINDING not in manifests.pod["metadata"].get("annotations", {})
    assert EGRESS_CREDENTIAL_KEY not in manifests.secret["stringData"]


def test_the_binding_carries_the_credentials_digest_and_each_identitys_rules() -> None:
    pod = _manifests(hooks={"afterTurn": [HOOK]}).pod
    assert pod["metadata"]["labels"][naming.LABEL_EGRESS] == naming.EGRESS_VIA_GATEWAY
    binding = _binding(pod)
    text = json.dumps(pod)
    assert EGRESS_CREDENTIAL not in text  # the pod spec never holds the credential
    assert binding["credentialSha256"] == hashlib.sha256(EGRESS_CREDENTIAL.encode()).hexdigest()
    assert (binding["namespace"], binding["session"], binding["agent"]) == (
        "team-a",
        "fix-bug",
        "coder",
    )
    assert binding["agentRules"] == [
        {"host": "pypi.org", "ports": []},
        {"host": "*.pythonhosted.org", "ports": [443]},
    ]
    custodian = binding["custodianRules"]
    assert {"host": "api.anthropic.com", "ports": [443], "private": True} in custodian
    assert {"host": "kubernetes.default.svc", "ports": [443], "private": True} in custodian
    assert {"host": "mirror.internal", "ports": [8443], "private": True} in custodian
    # Named by the Session's and the Agent's authors: never a private address by name.
    assert {"host": "git.example", "ports": [443], "private": False} in custodian
    assert {"host": "hooks.example", "ports": [8443], "private": False} in custodian
    assert binding["checkoutRules"] == []


def test_the_tools_get_the_proxy_without_a_credential_and_the_harness_gets_none() -> None:
    containers = _containers(_manifests().pod)
    tools = _env(containers["tools"])
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        assert tools[name]["value"] == "http://198.19.0.40:3128", name
    # The pod's own address is not sent to the gateway (which would refuse it as private):
    # the kubelet expands POD_IP, defined before NO_PROXY, from the pod's status.
    names = [e["name"] for e in containers["tools"]["env"]]
    assert names.index("POD_IP") < names.index("NO_PROXY")
    assert tools["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert tools["NO_PROXY"]["value"] == "localhost,127.0.0.1,::1,$(POD_IP)"
    harness = _env(containers["harness"])
    assert not {n for n in harness if "PROXY" in n.upper()}, harness.keys()


def test_the_credential_is_the_custodians_alone() -> None:
    manifests = _manifests()
    pod = manifests.pod
    assert manifests.secret["stringData"][EGRESS_CREDENTIAL_KEY] == EGRESS_CREDENTIAL
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["egress"]["secret"]["items"] == [
        {"key": EGRESS_CREDENTIAL_KEY, "path": "credential"}
    ]
    # The harness's view of the Secret lists its own two keys, not the proxy credential.
    assert EGRESS_CREDENTIAL_KEY not in json.dumps(volumes["wire"])
    mounted = {
        name: {m["name"] for m in c.get("volumeMounts", [])} for name, c in _containers(pod).items()
    }
    assert [n for n, m in mounted.items() if "egress" in m] == ["custodian"]
    custodian = _env(_containers(pod)["custodian"])
    assert custodian["CORRAL_EGRESS_PROXY"]["value"] == "http://198.19.0.40:3128"
    assert custodian["CORRAL_EGRESS_CREDENTIAL_FILE"]["value"].startswith(EGRESS_DIR)


def test_the_checkout_clones_as_the_custodian_before_the_agent_starts() -> None:
    checkout = _env(_containers(_manifests().pod)["checkout"])
    ref = checkout[EGRESS_CREDENTIAL_ENV]["valueFrom"]["secretKeyRef"]
    assert ref["key"] == EGRESS_CREDENTIAL_KEY
    assert checkout["HTTPS_PROXY"]["value"] == (
        f"http://custodian:$({EGRESS_CREDENTIAL_ENV})@198.19.0.40:3128"
    )
    assert checkout["GIT_PROXY_COMMAND"]["value"] == egress.GIT_PROXY_COMMAND


def test_an_evidence_pod_reaches_its_rules_and_its_git_host_with_no_credential() -> None:
    evidence = Evidence.model_validate(
        {
            "metadata": {"name": "unit-x", "namespace": "a", "uid": "ev-uid"},
            "spec": {
                "repo": "git://git.example/r.git",
                "revision": "a" * 40,
                "check": "unit",
                "command": "make test",
                "egress": [{"host": "pypi.org"}],
            },
        }
    )
    manifests = build_evidence_manifests(evidence, SETTINGS)
    assert manifests.network_policy["spec"]["egress"] == [egress.gateway_peer_rule(GATEWAY)]
    binding = _binding(manifests.pod)
    assert binding["credentialSha256"] == "" and binding["custodianRules"] == []
    assert binding["agentRules"] == [
        {"host": "pypi.org", "ports": []},
        {"host": "git.example", "ports": [9418], "private": False},
    ]
    env = {e["name"]: e.get("value") for e in manifests.pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == "http://198.19.0.40:3128"


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("https://api.example.com/v1", {"host": "api.example.com", "ports": [443]}),
        ("http://10.1.2.3:8080", {"host": "10.1.2.3", "ports": [8080]}),
        ("git://git.example/r.git", {"host": "git.example", "ports": [9418]}),
        ("ssh://git@git.example:2222/r.git", {"host": "git.example", "ports": [2222]}),
        ("git@github.com:team/repo.git", {"host": "github.com", "ports": [22]}),
        ("postgresql://u:p@db.internal/corral", {"host": "db.internal", "ports": [5432]}),
    ],
)
def test_a_url_becomes_the_rule_that_reaches_its_host(url: str, rule: dict[str, Any]) -> None:
    assert egress.url_rule(url, private=False) == {**rule, "private": False}


def test_a_local_path_needs_no_rule() -> None:
    assert egress.url_rule("/srv/git/repo.git", private=False) is None


def test_rules_need_exactly_one_of_host_and_cidr_and_methods_need_a_host() -> None:
    for bad in (
        {},
        {"host": "a.example", "cidr": "192.0.2.0/24"},
        {"cidr": "192.0.2.0/24", "methods": ["GET"]},
    ):
        with pytest.raises(ValueError):
            EgressRule.model_validate(bad)
    for bad_host in ("pypi.org.evil com", "*pypi.org", "a..b", "-a.example"):
        with pytest.raises(ValueError):
            EgressRule.model_validate({"host": bad_host})
    assert EgressRule.model_validate({"host": "*.pypi.org", "methods": ["GET"]}).methods == ["GET"]


def test_the_operator_takes_the_gateway_and_host_platform_egress_from_its_flags() -> None:
    args = parse_args(
        [
            "--all-namespaces",
            "--egress-gateway=198.19.0.40:3128",
            "--platform-egress=api.example.com:443,8443",
            "--platform-egress=203.0.113.0/24",
        ]
    )
    settings = settings_from(args)
    assert settings.egress_gateway is not None
    assert settings.egress_gateway.proxy_url == "http://198.19.0.40:3128"
    assert settings.platform_egress == (
        EgressTarget(host="api.example.com", ports=(443, 8443)),
        EgressTarget(cidr="203.0.113.0/24"),
    )
    with pytest.raises(SystemExit):
        parse_args(["--all-namespaces", "--egress-gateway=gateway.svc:3128"])
    with pytest.raises(SystemExit):
        parse_args(["--all-namespaces", "--platform-egress=not a host"])


def _service(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "corral-egress-gateway", "namespace": "corral-system"},
        "spec": {
            "clusterIP": "198.19.0.41",
            "selector": {"app.kubernetes.io/name": "corral-egress-gateway"},
            "ports": [
                {"name": "proxy", "port": 3128, "targetPort": "proxy"},
                {"name": "admin", "port": 9091, "targetPort": 9191},
            ],
            **spec,
        },
    }


def test_the_gateway_is_read_from_its_service() -> None:
    gateway = gateway_from_service(_service())
    assert (gateway.address, gateway.port, gateway.namespace) == (
        "198.19.0.41",
        3128,
        "corral-system",
    )
    assert gateway.pod_labels == {"app.kubernetes.io/name": "corral-egress-gateway"}
    assert gateway.admin_port == 9191
    # The NetworkPolicy names the pods' port, here by its name, as the Service targets it.
    settings = OperatorSettings(image="corral/sandbox:test", egress_gateway=gateway)
    (rule,) = egress.policy_egress(settings, [])
    assert rule["ports"] == [{"protocol": "TCP", "port": "proxy"}]
    assert egress.proxy_url(settings) == "http://198.19.0.41:3128"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"clusterIP": "None"}, "no clusterIP"),
        ({"ports": [{"name": "http", "port": 80}]}, "no port named 'proxy'"),
        ({"selector": {}}, "no selector"),
    ],
)
def test_a_service_that_cannot_be_the_gateway_is_refused_naming_why(
    spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(GatewayServiceError, match=words):
        gateway_from_service(_service(**spec))


def test_the_gateway_service_flag_wants_namespace_and_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse_args(
        ["--namespace", "a", "--egress-gateway-service", "corral-system/corral-egress-gateway"]
    )
    assert args.egress_gateway_service == ("corral-system", "corral-egress-gateway")
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "a", "--egress-gateway-service", "corral-egress-gateway"])
    assert "is not NAMESPACE/NAME" in capsys.readouterr().err


def test_with_a_key_each_binding_is_signed_for_its_pod_alone() -> None:
    keyed = dataclasses.replace(GATEWAY, binding_key="k" * 40)
    settings = dataclasses.replace(SETTINGS, egress_gateway=keyed)
    pod = build_sandbox(agent(), session(), settings, "t" * 40, "c" * 40).pod
    annotations = pod["metadata"]["annotations"]
    text = annotations[naming.ANNOTATION_EGRESS_BINDING]
    signature = annotations[naming.ANNOTATION_EGRESS_SIGNATURE]
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    message = f"{egress.SIGNATURE_CONTEXT}\n{namespace}\n{name}\n{text}".encode()
    assert signature == hmac.new(b"k" * 40, message, hashlib.sha256).hexdigest()
    # The same binding on another pod's name, or under another key, does not verify.
    assert egress.binding_signature("k" * 40, namespace, "corral-other", text) != signature
    assert egress.binding_signature("j" * 40, namespace, name, text) != signature
    # Without a key nothing is signed.
    unsigned = build_sandbox(agent(), session(), SETTINGS, "t" * 40, "c" * 40).pod
    assert naming.ANNOTATION_EGRESS_SIGNATURE not in unsigned["metadata"]["annotations"]


# ------------------------------------------------------------------ warm pools


def test_a_pooled_pod_behind_the_gateway_holds_no_credential_and_no_binding() -> None:
    """Until adopted a pooled pod is unknown to the gateway (nothing leaves it) and mounts no
    Session Secret: its custodian's proxy credential arrives with the adopt."""
    from corral_operator.builders.poolpod import build_pool_pod

    warm = agent(sandbox={"egress": PYPI, "warmPool": {"size": 1}})
    pod = build_pool_pod(warm, SETTINGS, "coder-warm-1", "h" * 43, "c" * 43).pod
    assert naming.LABEL_EGRESS not in pod["metadata"]["labels"]
    assert naming.ANNOTATION_EGRESS_BINDING not in pod["metadata"].get("annotations", {})
    assert "egress" not in {v["name"] for v in pod["spec"]["volumes"]}
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    custodian_env = {e["name"]: e for e in containers["custodian"]["env"]}
    assert "CORRAL_EGRESS_CREDENTIAL_FILE" not in custodian_env
    assert custodian_env["CORRAL_EGRESS_PROXY"]["value"] == GATEWAY.proxy_url
    assert all(m["name"] != "egress" for c in containers.values() for m in c["volumeMounts"])
    tools_env = {e["name"]: e.get("value") for e in containers["tools"]["env"]}
    assert tools_env["HTTPS_PROXY"] == GATEWAY.proxy_url  # the agent's identity: no credential


def test_an_adoption_binds_the_checkout_first_then_the_session_alone() -> None:
    """The claim's binding lets the agent's identity reach the git host (the adopt's checkout
    runs in the tools container, without the credential); the binding after it does not."""
    from corral_operator.builders.podbuilder import session_binding

    warm = agent(sandbox={"egress": PYPI, "warmPool": {"size": 1}})
    repo = "https://git.example/team/repo.git"

    def bound(checkout: bool) -> dict[str, Any]:
        annotations = session_binding(
            warm, "agents", "s1", repo, SETTINGS, EGRESS_CREDENTIAL,
            pod="coder-warm-1", agent_name="coder", checkout=checkout,
        )  # fmt: skip
        text = annotations[naming.ANNOTATION_EGRESS_BINDING]
        signed = annotations.get(naming.ANNOTATION_EGRESS_SIGNATURE)
        assert signed is None  # SETTINGS has no binding key
        value: dict[str, Any] = json.loads(text)
        return value

    during, after = bound(True), bound(False)
    assert during["checkoutRules"] == [{"host": "git.example", "ports": [443], "private": False}]
    assert after["checkoutRules"] == []
    assert during["credentialSha256"] == hashlib.sha256(EGRESS_CREDENTIAL.encode()).hexdigest()
    assert {k: v for k, v in during.items() if k != "checkoutRules"} == {
        k: v for k, v in after.items() if k != "checkoutRules"
    }


def test_the_custodians_adopt_carries_the_proxy_credential_only_behind_a_gateway() -> None:
    from corral_operator.session.adoption import adopt_requests

    warm = agent(sandbox={"egress": PYPI, "warmPool": {"size": 1}})
    ask = session(workspace={"repo": "https://git.example/team/repo.git", "ref": "main"})
    told, _ = adopt_requests(SETTINGS, warm, ask, "w" * 43, "c" * 43, None, EGRESS_CREDENTIAL)
    assert told.egressCredential == EGRESS_CREDENTIAL
    without = dataclasses.replace(SETTINGS, egress_gateway=None)
    told, _ = adopt_requests(without, warm, ask, "w" * 43, "c" * 43, None, EGRESS_CREDENTIAL)
    assert told.egressCredential is None


@pytest.mark.parametrize(
    ("dsn", "rule"),
    [
        ("postgresql://u:p@db.internal:6432/m", {"host": "db.internal", "ports": [6432]}),
        ("host=db.internal port=6543 password='a b'", {"host": "db.internal", "ports": [6543]}),
        ("host=db.internal dbname=m", {"host": "db.internal", "ports": [5432]}),
        ("host=/var/run/postgresql dbname=m", None),
        ("host=db.internal password='unbalanced", None),
    ],
)  # fmt: skip
def test_the_memory_database_is_reached_whatever_form_its_dsn_takes(
    dsn: str, rule: dict[str, Any] | None
) -> None:
    found = egress.dsn_rule(dsn)
    assert found == (None if rule is None else {**rule, "private": True})
