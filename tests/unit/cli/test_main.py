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
    assert main(["run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "corral run: error: the following arguments are required: -f/--filename",
        "corral run: see `corral run --help`",
    ]


def test_every_command_has_help_that_says_what_its_exit_status_means(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from corral_cli.main import COMMANDS

    for command in COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0
        help_text = " ".join(capsys.readouterr().out.split())
        assert "exit status: 0 " in help_text and "2 " in help_text, (command, help_text)
        assert "--no-color" in help_text, command


def test_version_is_the_packages_and_needs_no_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version", "--client"]) == 0
    assert capsys.readouterr().out == f"Client Version: corral {version('corral')}\n"


def test_no_color_anywhere_on_the_line_sets_no_color(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    monkeypatch.setenv("NO_COLOR", "")  # and the test's end puts back what was there
    assert main(["version", "--client", "--no-color"]) == 0
    assert os.environ["NO_COLOR"] == "1"
    capsys.readouterr()
