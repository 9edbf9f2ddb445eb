"""The operator's command line: settings it builds and the mistakes it refuses."""

from __future__ import annotations

import pytest

from corral_operator.main import parse_args, settings_from
from corral_operator.settings import EgressTarget


def test_flags_become_settings() -> None:
    args = parse_args(
        [
            "-n",
            "team-a",
            "--image",
            "sandbox:1",
            "--platform-egress",
            "10.96.0.1/32:443,6443",
            "--operator-pod-label",
            "app=op",
            "--kube-ca-configmap",
            "",
        ]
    )
    s = settings_from(args)
    assert args.namespace == ["team-a"]
    assert s.image == "sandbox:1"
    assert s.platform_egress == (EgressTarget("10.96.0.1/32", (443, 6443)),)
    assert s.operator_pod_labels == {"app": "op"}
    assert s.kube_ca_configmap is None


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no namespace and not --all-namespaces
        ["-A", "--platform-egress", "10.0.0.1/33"],
        ["-A", "--platform-egress", "10.0.0.0/8:https"],
        ["-A", "--operator-pod-label", "novalue"],
        ["-A", "--token-expiry-seconds", "60"],
        ["-A", "--tools-uid", "0"],
        ["-A", "--tools-uid", "10001"],  # the same uid as the harness
        ["-A", "--fs-group", "10003"],  # a role's uid is no shared group
        ["-A", "--dns-pod-label", "novalue"],
        ["-A", "--api-writes-in-flight", "0"],
    ],
)
def test_bad_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_local_repo_root_is_off_by_default_and_made_absolute(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings_from(parse_args(["-A"])).local_repo_root is None
    monkeypatch.chdir(str(tmp_path))
    s = settings_from(parse_args(["-A", "--local-repo-root", "repos"]))
    assert s.local_repo_root == f"{tmp_path}/repos"
    # A git server's base URL (the dev cluster's git daemon) is kept as given.
    url = settings_from(parse_args(["-A", "--local-repo-root", "git://127.0.0.1:9418/"]))
    assert url.local_repo_root == "git://127.0.0.1:9418/"


def test_uids_and_dns_flags_become_settings() -> None:
    defaults = settings_from(parse_args(["-A"]))
    assert (defaults.harness_uid, defaults.tools_uid, defaults.custodian_uid) == (
        10001,
        10002,
        10003,
    )
    assert defaults.fs_group == 10000
    assert defaults.dns_namespace == "kube-system"
    assert defaults.dns_pod_labels == {"k8s-app": "kube-dns"}
    s = settings_from(
        parse_args(
            [
                "-A",
                "--harness-uid=2001",
                "--tools-uid=2002",
                "--custodian-uid=2003",
                "--fs-group=2000",
                "--dns-namespace=dns",
                "--dns-pod-label=app=coredns",
            ]
        )
    )
    assert (s.harness_uid, s.tools_uid, s.custodian_uid, s.fs_group) == (2001, 2002, 2003, 2000)
    assert s.run_as_user == 2002  # a pod that holds nothing (Evidence) runs as the tools uid
    assert s.dns_namespace == "dns" and s.dns_pod_labels == {"app": "coredns"}


def test_writes_in_flight_reach_the_api_adapter() -> None:
    assert settings_from(parse_args(["-A"])).api_writes_in_flight == 6
    s = settings_from(parse_args(["-A", "--api-writes-in-flight", "24"]))
    assert s.api_writes_in_flight == 24
