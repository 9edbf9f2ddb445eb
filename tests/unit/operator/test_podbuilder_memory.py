"""The memory database's DSN reaches the custodian alone: copied into the Session's Secret,
projected into the custodian as one file, absent from the harness, the tools and the checkout."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from corral_operator.builders.podbuilder import MEMORY_DSN_KEY, build_sandbox
from corral_operator.main import parse_args, settings_from
from corral_operator.settings import EgressGateway
from tests._objects import agent, session

from .test_podbuilder import CREDENTIAL, SETTINGS, TOKEN

DSN = "postgresql://corral:s3cret-pw@198.18.5.5:5432/corral"


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


def test_the_dsn_is_the_custodians_alone() -> None:
    manifests = build_sandbox(
        agent(), session(), replace(SETTINGS, memory_dsn=DSN), TOKEN, CREDENTIAL
    )
    assert manifests.secret["stringData"][MEMORY_DSN_KEY] == DSN
    spec = manifests.pod["spec"]
    volumes = _by_name(spec["volumes"])
    assert volumes["memory"]["secret"]["items"] == [{"key": MEMORY_DSN_KEY, "path": "dsn"}]
    # The harness's view of the same Secret lists its two keys and not the DSN.
    assert MEMORY_DSN_KEY not in json.dumps(volumes["wire"])
    containers = _by_name(spec["containers"] + spec["initContainers"])
    custodian = containers.pop("custodian")
    assert {m["name"] for m in custodian["volumeMounts"]} >= {"memory"}
    env = {e["name"]: e.get("value") for e in custodian["env"]}
    assert env["CORRAL_MEMORY_DSN_FILE"] == "/var/run/corral/memory/dsn"
    for name, container in containers.items():
        assert "memory" not in {m["name"] for m in container.get("volumeMounts", [])}, name
        assert "MEMORY" not in json.dumps(container.get("env", [])), name
    assert DSN not in json.dumps(manifests.pod)  # only ever in the Secret


GATEWAY = EgressGateway(address="198.19.0.40", port=3128, namespace="gw", pod_labels={"a": "b"})


@pytest.mark.parametrize("gateway", [None, GATEWAY], ids=["no-gateway", "gateway"])
def test_behind_the_gateway_the_custodian_forwards_from_a_directory_of_its_own(
    gateway: EgressGateway | None,
) -> None:
    settings = replace(SETTINGS, memory_dsn=DSN, egress_gateway=gateway)
    spec = build_sandbox(agent(), session(), settings, TOKEN, CREDENTIAL).pod["spec"]
    containers = _by_name(spec["containers"] + spec["initContainers"])
    env = {e["name"]: e.get("value") for e in containers["custodian"]["env"]}
    if gateway is None:  # the custodian connects itself (the CIDR NetworkPolicy lets it)
        assert "CORRAL_MEMORY_SOCKET_DIR" not in env
        return
    socket_dir = env["CORRAL_MEMORY_SOCKET_DIR"]
    assert socket_dir == "/var/lib/corral/custodian/memory-socket"
    # On a volume the custodian alone mounts, writable: never loopback, which the tools share.
    mounts = _by_name(containers.pop("custodian")["volumeMounts"])
    volume = next(m for m in mounts.values() if socket_dir.startswith(m["mountPath"] + "/"))
    assert not volume.get("readOnly") and "emptyDir" in _by_name(spec["volumes"])[volume["name"]]
    for name, container in containers.items():
        assert volume["name"] not in {m["name"] for m in container.get("volumeMounts", [])}, name


def test_without_a_dsn_nothing_is_mounted() -> None:
    manifests = build_sandbox(agent(), session(), SETTINGS, TOKEN, CREDENTIAL)
    assert MEMORY_DSN_KEY not in manifests.secret["stringData"]
    assert "memory" not in _by_name(manifests.pod["spec"]["volumes"])
    assert "CORRAL_MEMORY" not in json.dumps(manifests.pod)


def test_the_operator_reads_the_dsn_file(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(DSN + "\n")
    args = parse_args(["--namespace", "default", "--memory-dsn-file", str(dsn_file)])
    assert settings_from(args).memory_dsn == DSN
    assert DSN not in repr(settings_from(args))  # never in a log line of the settings
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "default", "--memory-dsn-file", str(tmp_path / "empty")])
    assert "is empty" in capsys.readouterr().err
