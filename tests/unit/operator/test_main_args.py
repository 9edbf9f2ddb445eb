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
        ["-A", "--platform-egress", "10.0.0.1"],
        ["-A", "--platform-egress", "10.0.0.0/8:https"],
        ["-A", "--operator-pod-label", "novalue"],
        ["-A", "--token-expiry-seconds", "60"],
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
