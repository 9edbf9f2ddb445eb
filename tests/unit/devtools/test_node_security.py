"""The local node's pure identity, volume-mode and mount-plan rules (as the kubelet has them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from corral_dev._node_host import NodeHost
from corral_dev._node_spec import (
    CAPABILITIES,
    RUNTIME_DEFAULT_CAPABILITIES,
    ContainerConfigError,
    ContainerSecurity,
    MountOp,
    container_capabilities,
    container_security,
    fs_group_mode,
    fs_user,
    identity_refusal,
    mount_plan,
    token_mode,
)

RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def pod(security: dict[str, Any] | None = None, *containers: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if security is not None:
        spec["securityContext"] = security
    return spec


# ------------------------------------------------------------------------------- identity


def test_the_container_context_wins_over_the_pods_and_fs_group_is_a_supplementary_group() -> None:
    spec = pod({"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10000})
    harness = {"name": "harness", "securityContext": RESTRICTED}
    tools = {"name": "tools", "securityContext": {**RESTRICTED, "runAsUser": 10002}}
    custodian = {
        "name": "custodian",
        "securityContext": {**RESTRICTED, "runAsUser": 10003, "runAsGroup": 10003},
    }
    assert container_security(spec, harness) == ContainerSecurity(
        uid=10001, gid=10001, groups=(10000,), no_new_privs=True, capabilities=frozenset()
    )
    assert (container_security(spec, tools).uid, container_security(spec, tools).gid) == (
        10002,
        10001,  # runAsGroup from the pod
    )
    assert container_security(spec, custodian).gid == 10003
    assert container_security(spec, custodian).groups == (10000,)


def test_a_uid_without_a_group_gets_group_0_and_no_uid_means_the_nodes_own_user() -> None:
    alone = container_security(pod(), {"name": "c", "securityContext": {"runAsUser": 5}})
    assert (alone.uid, alone.gid) == (5, 0)  # what the runtime gives a uid /etc/passwd lacks
    nobody = container_security(pod({"fsGroup": 7}), {"name": "c"})
    assert (nobody.uid, nobody.gid) == (None, None)


def test_supplemental_groups_follow_the_fs_group_once_each() -> None:
    spec = pod({"runAsUser": 1, "fsGroup": 10000, "supplementalGroups": [10000, 20, 30]})
    assert container_security(spec, {"name": "c"}).groups == (10000, 20, 30)


def test_no_new_privs_only_when_privilege_escalation_is_refused() -> None:
    assert container_security(pod(), {"name": "c"}).no_new_privs is False
    sc = {"allowPrivilegeEscalation": True}
    assert container_security(pod(), {"name": "c", "securityContext": sc}).no_new_privs is False
    sc = {"allowPrivilegeEscalation": False}
    assert container_security(pod(), {"name": "c", "securityContext": sc}).no_new_privs is True


def test_run_as_non_root_with_uid_0_is_refused_as_the_kubelet_refuses_it() -> None:
    with pytest.raises(ContainerConfigError, match="runAsNonRoot"):
        root = {"name": "c", "securityContext": {"runAsUser": 0}}
        container_security(pod({"runAsNonRoot": True}), root)


def test_capabilities_as_containerd_builds_the_bounding_set() -> None:
    assert container_capabilities({}) == RUNTIME_DEFAULT_CAPABILITIES
    assert container_capabilities({"capabilities": {"drop": ["ALL"]}}) == frozenset()
    assert container_capabilities(
        {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    ) == {"NET_BIND_SERVICE"}
    assert container_capabilities({"capabilities": {"drop": ["CAP_NET_RAW", "kill"]}}) == (
        RUNTIME_DEFAULT_CAPABILITIES - {"NET_RAW", "KILL"}
    )
    assert container_capabilities({"privileged": True}) == frozenset(CAPABILITIES)
    assert "SYS_ADMIN" not in container_capabilities({})
    with pytest.raises(ContainerConfigError, match="unknown capabilities"):
        container_capabilities({"capabilities": {"add": ["FLY"]}})
    assert CAPABILITIES.index("SYS_ADMIN") == 21 and CAPABILITIES.index("SETPCAP") == 8
    assert len(CAPABILITIES) == 41


def test_a_node_that_cannot_switch_users_refuses_other_identities_only() -> None:
    def sec(uid: int | None, gid: int | None = None) -> ContainerSecurity:
        return ContainerSecurity(uid, gid, (), False, frozenset())

    assert identity_refusal(sec(10001), 0, 0, can_switch=True) is None
    refused = identity_refusal(sec(10001), 1000, 1000, can_switch=False)
    assert refused and "runAsUser 10001" in refused and "uid 1000" in refused
    assert identity_refusal(sec(1000, 1000), 1000, 1000, can_switch=False) is None
    assert identity_refusal(sec(None), 1000, 1000, can_switch=False) is None  # today's way
    group = identity_refusal(sec(1000, 5), 1000, 1000, can_switch=False)
    assert group and "runAsGroup 5" in group


def test_fs_user_is_the_one_uid_every_container_runs_as() -> None:
    one = {"securityContext": {"runAsUser": 10001}}
    assert fs_user({"containers": [one, one], "initContainers": [one]}) == 10001
    assert fs_user({"securityContext": {"runAsUser": 7}, "containers": [{}, {}]}) == 7
    two = {"securityContext": {"runAsUser": 10002}}
    assert fs_user({"containers": [one, two]}) is None
    assert fs_user({"containers": [one, {}]}) is None


# --------------------------------------------------------------------------- volume modes


def test_volume_modes_as_set_volume_ownership_leaves_them() -> None:
    # An emptyDir (0777) with an fsGroup: setgid and the group bits, i.e. 2777.
    assert fs_group_mode(0o777, is_dir=True, read_only=False) == 0o2777
    # A secret file: group read added for the fsGroup, never write.
    assert fs_group_mode(0o400, is_dir=False, read_only=True) == 0o440
    assert fs_group_mode(0o440, is_dir=False, read_only=True) == 0o440
    assert fs_group_mode(0o644, is_dir=False, read_only=True) == 0o644
    # An API volume's directory.
    assert fs_group_mode(0o755, is_dir=True, read_only=True) == 0o2755
    # A file in a read-write volume gets group read and write.
    assert fs_group_mode(0o600, is_dir=False, read_only=False) == 0o660


def test_a_token_is_0600_when_the_pod_has_an_fs_user_or_group() -> None:
    assert token_mode(0o440, None, None) == 0o440
    assert token_mode(0o440, 10001, None) == 0o600
    assert token_mode(0o644, None, 10000) == 0o600
    assert fs_group_mode(token_mode(0o644, None, 10000), is_dir=False, read_only=True) == 0o640


# ---------------------------------------------------------------------------- mount plan


def test_the_plan_hides_then_binds_back_parents_first() -> None:
    plan = mount_plan(
        ["/tmp/node", "/root", "/tmp"],
        [
            ("/tmp/node/pods/p/volumes/a", "/tmp/node/pods/p/volumes/a", False),
            ("/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7", True),
            ("/work/main", "/work/main", True),
        ],
    )
    assert plan == [
        MountOp("tmpfs", "/root", mode=0o755),
        MountOp("tmpfs", "/tmp", mode=0o1777),
        MountOp("bind", "/work/main", "/work/main", read_only=True),
        MountOp("bind", "/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7", True),
        MountOp("bind", "/tmp/node/pods/p/volumes/a", "/tmp/node/pods/p/volumes/a", False),
    ]  # /tmp/node needs no tmpfs of its own: /tmp's hides it


def test_a_hidden_dir_inside_a_shared_one_is_hidden_again() -> None:
    plan = mount_plan(
        ["/work/main/.corral/dev/node"],
        [("/work/main", "/work/main", True), ("/work/main/.venv", "/work/main/.venv", True)],
    )
    assert plan == [
        MountOp("bind", "/work/main", "/work/main", read_only=True),
        MountOp("tmpfs", "/work/main/.corral/dev/node", mode=0o755),
    ]  # and the venv is already shown by the repository's bind


def test_the_system_is_never_hidden_and_read_write_wins_on_one_target() -> None:
    hide = ["/", "/etc", "/usr/lib", "/etc/kubernetes"]
    plan = mount_plan(hide, [("/v", "/v", True), ("/v", "/v", False)])
    assert plan == [
        MountOp("bind", "/v", "/v", read_only=False),
        MountOp("tmpfs", "/etc/kubernetes", mode=0o755),
    ]


def test_the_host_plan_hides_the_node_root_tmp_and_the_cluster_state(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "state" / "kubeconfig"
    host = NodeHost(
        workdir=tmp_path / "node",
        venv_bin=Path(sys.executable).parent,
        kubeconfig=kubeconfig,
        root=True,
    )
    volume = str(tmp_path / "node" / "pods" / "p" / "volumes" / "v")
    plan = host.plan([(volume, volume, True)], None)
    tmpfs = {op.target for op in plan if op.kind == "tmpfs"}
    binds = {op.target: op for op in plan if op.kind == "bind"}
    assert {"/root", "/tmp"} <= tmpfs
    assert str(tmp_path / "node") in tmpfs or str(tmp_path).startswith("/tmp/")
    assert str(kubeconfig.parent) in tmpfs or str(tmp_path).startswith("/tmp/")
    assert binds[volume].read_only is True
    assert os.path.realpath(sys.base_prefix) in binds  # the interpreter runs in there
    spec = host.sandbox_spec(
        security=ContainerSecurity(10001, 10001, (10000,), True, frozenset({"KILL"})),
        plan=plan,
        executable="/bin/true",
        argv=["/bin/true"],
        env={"A": "b"},
        cwd="/",
    )
    assert spec["identity"] == {"uid": 10001, "gid": 10001, "groups": [10000]}
    assert spec["capabilities"] == [CAPABILITIES.index("KILL")]
    assert spec["noNewPrivs"] is True
    assert spec["mounts"][0]["kind"] == "tmpfs"


def test_shared_directories_are_read_only_owned_binds_even_inside_another_share() -> None:
    plan = mount_plan(
        ["/root"],
        [("/work/main", "/work/main", True), ("/work/main/repos", "/work/main/repos", True),
         ("/root/repos", "/root/repos", False)],
        owned=("/work/main/repos", "/root/repos"),
    )  # fmt: skip
    assert MountOp("bind", "/work/main/repos", "/work/main/repos", True, owned=True) in plan
    assert MountOp("bind", "/root/repos", "/root/repos", True, owned=True) in plan
