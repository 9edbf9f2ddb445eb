"""The `corral` entry point dispatches to its commands."""

from __future__ import annotations

import pytest

from corral_cli.main import main


def test_no_command_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "corral run -f session.yaml" in capsys.readouterr().out


def test_help_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "commands:" in capsys.readouterr().out


def test_an_unknown_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rnu"]) == 2
    assert "unknown command 'rnu'" in capsys.readouterr().err


def test_run_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run"])
    assert exited.value.code == 2
    assert "-f/--filename" in capsys.readouterr().err
