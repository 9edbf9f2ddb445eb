"""The pod for an Agent with `credentials.hookSecretRef`: the Secret reaches the custodian
alone, which adds its keys to http hooks (docs/hooks.md)."""

from __future__ import annotations

from typing import Any

from corral_operator.builders.podbuilder import HOOK_SECRET_DIR, build_pod
from corral_operator.settings import OperatorSettings
from tests._objects import agent, session

SETTINGS = OperatorSettings(image="corral/sandbox:test", operator_namespace="corral-system")


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def test_the_hook_secret_is_mounted_into_the_custodian_only() -> None:
    pod = build_pod(
        agent(credentials={"hookSecretRef": {"name": "policy-server"}}), session(), SETTINGS
    )
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "hook-secret"]
    assert volume["secret"] == {"secretName": "policy-server", "defaultMode": 0o440}
    holders = {
        name
        for name, container in _containers(pod).items()
        if any(m["name"] == "hook-secret" for m in container.get("volumeMounts", []))
    }
    assert holders == {"custodian"}
    custodian = _containers(pod)["custodian"]
    (mount,) = [m for m in custodian["volumeMounts"] if m["name"] == "hook-secret"]
    assert mount["mountPath"] == HOOK_SECRET_DIR and mount["readOnly"] is True
    env = {e["name"]: e.get("value") for e in custodian["env"]}
    assert env["CORRAL_HOOK_SECRET_DIR"] == HOOK_SECRET_DIR


def test_no_hook_secret_no_volume() -> None:
    pod = build_pod(agent(), session(), SETTINGS)
    assert all(v["name"] != "hook-secret" for v in pod["spec"]["volumes"])
    env = {e["name"] for e in _containers(pod)["custodian"]["env"]}
    assert "CORRAL_HOOK_SECRET_DIR" not in env
