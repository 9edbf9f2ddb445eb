from __future__ import annotations

from pathlib import Path

import pytest

from corral_harness.config import ConfigError, HarnessConfig


def test_defaults_are_the_designs(tmp_path: Path) -> None:
    config = HarnessConfig.from_env({"CORRAL_GRANTED_ROOT": str(tmp_path)})
    assert (config.host, config.port) == ("0.0.0.0", 8080)
    assert config.pick_sweep_seconds == 10.0
    assert config.stream_idle_seconds == 120.0
    assert config.stream_cap_seconds == 300.0
    assert config.model_retries == 2
    assert config.durable and not config.read_only
    assert config.token_file is None and config.custodian_url is None


def test_the_environment_sets_everything(tmp_path: Path) -> None:
    config = HarnessConfig.from_env(
        {
            "CORRAL_HARNESS_ADDR": "127.0.0.1:9000",
            "CORRAL_GRANTED_ROOT": str(tmp_path),
            "CORRAL_STATE_DIR": str(tmp_path / "s"),
            "CORRAL_WIRE_TOKEN_FILE": "/t",
            "CORRAL_CUSTODIAN_URL": "http://10.0.0.1:8081/",
            "CORRAL_READ_ONLY": "1",
            "ANTHROPIC_BASE_URL": "http://10.0.0.1:8081",
            "CORRAL_PICK_SWEEP_SECONDS": "0.5",
        }
    )
    assert (config.host, config.port) == ("127.0.0.1", 9000)
    assert config.custodian_url == "http://10.0.0.1:8081"
    assert config.read_only and config.token_file == Path("/t")
    assert config.model_base_url == "http://10.0.0.1:8081"
    assert config.pick_sweep_seconds == 0.5


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CORRAL_HARNESS_ADDR": "8080"}, "host:port"),
        ({"CORRAL_GRANTED_ROOT": "/does/not/exist"}, "not a directory"),
        ({"CORRAL_READ_ONLY": "maybe"}, "1 or 0"),
        ({"CORRAL_PICK_SWEEP_SECONDS": "-1"}, "negative"),
        ({"CORRAL_STREAM_IDLE_SECONDS": "soon"}, "number"),
        ({"CORRAL_ENGINE": "fast"}, "CORRAL_ENGINE must be one of lean, sdk"),
    ],
)
def test_bad_settings_are_refused_clearly(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        HarnessConfig.from_env({"CORRAL_GRANTED_ROOT": str(tmp_path), **env})


def test_with_an_exec_service_the_root_need_not_exist_here(tmp_path: Path) -> None:
    env = {"CORRAL_GRANTED_ROOT": "/workspace/not/mounted/here", "CORRAL_EXEC_SOCKET": "/s/e.sock"}
    config = HarnessConfig.from_env(env)
    assert config.exec_socket == Path("/s/e.sock")
    assert config.granted_root == Path("/workspace/not/mounted/here")
    assert HarnessConfig.from_env({"CORRAL_GRANTED_ROOT": str(tmp_path)}).exec_socket is None
    with pytest.raises(ConfigError, match="absolute"):
        HarnessConfig.from_env({"CORRAL_GRANTED_ROOT": "relative", "CORRAL_EXEC_SOCKET": "/s"})
