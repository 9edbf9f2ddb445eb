"""The platform's model providers in the sandbox pod (docs/providers.md): the Agent names one,
its custodian alone gets the entry and the credential it takes, its endpoints become the
custodian's credentialed destinations at the gateway, and an Agent that names an undefined
provider (or lacks its credential) makes no sandbox, with a message that says why."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from corral_api.providers import ProviderError, load_providers, parse_providers
from corral_operator import naming
from corral_operator.builders.podbuilder import build_sandbox
from corral_operator.main import parse_args, settings_from
from corral_operator.sandboxspec import SandboxSpecError, check_sandbox
from corral_operator.settings import EgressGateway, OperatorSettings
from tests._objects import agent, session

PROVIDERS = parse_providers(
    [
        {"name": "anthropic", "type": "anthropic", "default": True},
        {"name": "bedrock-us", "type": "bedrock", "region": "us-east-1"},
        {
            "name": "bedrock-wi",
            "type": "bedrock",
            "region": "eu-west-1",
            "webIdentity": True,
            "roleArn": "arn:aws:iam::123456789012:role/corral-bedrock",
        },
        {"name": "vertex", "type": "vertex", "project": "acme-ml", "region": "us-east5"},
        {
            "name": "llm-gw",
            "type": "gateway",
            "baseUrl": "https://llm.internal.example:8443",
            "authHeader": "authorization",
            "authScheme": "Bearer",
        },
    ]
)
SETTINGS = OperatorSettings(
    image="corral/sandbox:test",
    model_providers=tuple(PROVIDERS),
    egress_gateway=EgressGateway(
        address="198.19.0.40",
        port=3128,
        namespace="corral-system",
        pod_labels={"app.kubernetes.io/name": "corral-egress-gateway"},
    ),
)
AWS = {"awsSecretRef": {"name": "aws-keys"}}
GCP = {"gcpSecretRef": {"name": "gcp-key", "key": "key.json"}}


def _pod(provider: str | None, credentials: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"credentials": credentials or {}}
    if provider is not None:
        spec["provider"] = provider
    manifests = build_sandbox(
        agent(**spec), session(), SETTINGS, "w" * 43, "c" * 43, egress_credential="e" * 43
    )
    return manifests.pod


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _custodian_hosts(pod: dict[str, Any]) -> set[str]:
    binding = json.loads(pod["metadata"]["annotations"][naming.ANNOTATION_EGRESS_BINDING])
    return {r["host"] for r in binding["custodianRules"] if "host" in r}


def _only_custodian_mounts(pod: dict[str, Any], volume: str) -> None:
    for name, container in _containers(pod).items():
        mounted = {m["name"] for m in container.get("volumeMounts", [])}
        assert (volume in mounted) == (name == "custodian"), name


def test_a_bedrock_agent_s_custodian_gets_the_entry_and_the_aws_secret_alone() -> None:
    pod = _pod("bedrock-us", AWS)
    custodian = _env(_containers(pod)["custodian"])
    entry = json.loads(custodian["CORRAL_MODEL_PROVIDER"])
    assert entry == {"name": "bedrock-us", "type": "bedrock", "region": "us-east-1"}
    assert custodian["CORRAL_AWS_CREDENTIALS_DIR"] == "/var/run/corral/aws"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["aws-credentials"]["secret"]["secretName"] == "aws-keys"
    assert "model-key" not in volumes
    _only_custodian_mounts(pod, "aws-credentials")
    for name in ("harness", "tools"):
        assert "CORRAL_MODEL_PROVIDER" not in _env(_containers(pod)[name])
    hosts = _custodian_hosts(pod)
    assert "bedrock-runtime.us-east-1.amazonaws.com" in hosts
    assert "api.anthropic.com" not in hosts  # only the Agent's own provider is reachable


def test_web_identity_is_a_second_projected_token_for_sts_in_the_custodian_alone() -> None:
    pod = _pod("bedrock-wi")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    source = volumes["aws-web-identity"]["projected"]["sources"][0]["serviceAccountToken"]
    assert source["audience"] == "sts.amazonaws.com"
    _only_custodian_mounts(pod, "aws-web-identity")
    custodian = _env(_containers(pod)["custodian"])
    assert (
        custodian["CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE"] == "/var/run/corral/aws-web-identity/token"
    )
    assert {"bedrock-runtime.eu-west-1.amazonaws.com", "sts.eu-west-1.amazonaws.com"} <= (
        _custodian_hosts(pod)
    )


def test_a_vertex_agent_gets_its_key_and_reaches_the_token_endpoint_and_its_region() -> None:
    pod = _pod("vertex", GCP)
    custodian = _env(_containers(pod)["custodian"])
    assert custodian["CORRAL_GCP_KEY_FILE"] == "/var/run/corral/gcp/key.json"
    _only_custodian_mounts(pod, "gcp-key")
    assert {"oauth2.googleapis.com", "us-east5-aiplatform.googleapis.com"} <= _custodian_hosts(pod)


def test_a_gateway_agent_keeps_its_model_key_and_reaches_the_gateway() -> None:
    pod = _pod("llm-gw", {"modelSecretRef": {"name": "gw-key", "key": "token"}})
    custodian = _env(_containers(pod)["custodian"])
    assert json.loads(custodian["CORRAL_MODEL_PROVIDER"])["authHeader"] == "authorization"
    assert custodian["CORRAL_MODEL_KEY_FILE"] == "/var/run/corral/model/key"
    binding = json.loads(pod["metadata"]["annotations"][naming.ANNOTATION_EGRESS_BINDING])
    assert {"host": "llm.internal.example", "ports": [8443], "private": True} in (
        binding["custodianRules"]
    )


def test_an_agent_naming_no_provider_gets_the_default() -> None:
    custodian = _env(_containers(_pod(None))["custodian"])
    assert json.loads(custodian["CORRAL_MODEL_PROVIDER"])["name"] == "anthropic"


def test_without_model_providers_the_pod_is_as_before() -> None:
    plain = dataclasses.replace(SETTINGS, model_providers=())
    manifests = build_sandbox(agent(), session(), plain, "w" * 43, "c" * 43)
    custodian = _env(_containers(manifests.pod)["custodian"])
    assert "CORRAL_MODEL_PROVIDER" not in custodian
    assert custodian["CORRAL_UPSTREAM_URL"] == plain.model_upstream_url


@pytest.mark.parametrize(
    ("provider", "credentials", "words"),
    [
        ("bedrock-eu", {}, "'bedrock-eu', which is not defined (known: anthropic, bedrock-us"),
        ("bedrock-us", {}, "needs credentials.awsSecretRef"),
        ("vertex", AWS, "needs credentials.gcpSecretRef"),
    ],
)
def test_an_agent_that_cannot_reach_its_provider_makes_no_sandbox(
    provider: str, credentials: dict[str, Any], words: str
) -> None:
    with pytest.raises(SandboxSpecError) as refused:
        check_sandbox(agent(provider=provider, credentials=credentials), session(), SETTINGS)
    assert words in str(refused.value)


def test_the_platform_list_is_checked_with_messages_a_person_understands() -> None:
    cases = [
        ([{"name": "a", "type": "bedrock"}], "modelProviders[0]: a bedrock provider needs region"),
        (
            [{"name": "a", "type": "anthropic", "region": "x"}],
            "region is not a field of a anthropic",
        ),
        (
            [{"name": "a", "type": "anthropic"}, {"name": "a", "type": "anthropic"}],
            "provider 'a' is defined twice",
        ),
        (
            [{"name": "a", "type": "bedrock", "region": "us-east-1", "webIdentity": True}],
            "webIdentity needs roleArn",
        ),
        (
            [{"name": "a", "type": "gateway", "baseUrl": "https://user:pw@gw.example"}],
            "must not carry a user",
        ),
        (
            [{"name": "a", "type": "gateway", "baseUrl": "https://gw", "authHeader": "host"}],
            "carries something else",
        ),
    ]
    for data, words in cases:
        with pytest.raises(ProviderError) as refused:
            parse_providers(data)
        assert words in str(refused.value), str(refused.value)


def test_the_operator_reads_the_chart_s_providers_file(tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text(json.dumps([{"name": "vertex", "type": "vertex", "project": "acme-ml",
                                 "region": "europe-west1"}]))  # fmt: skip
    args = parse_args(["--all-namespaces", f"--model-providers-file={path}"])
    settings = settings_from(args)
    assert [p.name for p in settings.model_providers] == ["vertex"]
    assert load_providers("modelProviders: []", "x") == []


def test_a_bad_providers_file_stops_the_operator_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("- {name: v, type: vertex, region: us-east5}\n")
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--all-namespaces", f"--model-providers-file={path}"])
    assert stopped.value.code == 2
    assert "a vertex provider needs project" in capsys.readouterr().err
