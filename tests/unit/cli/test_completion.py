"""`corral completion bash|zsh|fish`: the scripts `corral` prints, loaded into the real shells
and asked to complete, as a person's Tab would (bash through its completion variables, fish
through `complete -C`, zsh at a terminal: a pty). The options and choices offered are the
parsers' own, so a new option is completed without anyone touching the scripts."""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral_cli.main import COMMANDS, command_parser


def corral_argv() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from corral_cli.main import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("completion")
    found = {}
    for shell in ("bash", "zsh", "fish"):
        done = subprocess.run([*corral_argv(), "completion", shell], capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        found[shell] = out / f"corral.{shell}"
        found[shell].write_text(done.stdout)
    return found


INSTALL = Path(__file__).resolve().parents[3] / "hack" / "install-shells.sh"
REQUIRE = os.environ.get("CORRAL_REQUIRE_NODE", "") not in ("", "0")


def _shell(name: str) -> str:
    """The shell's path, installed by hack/install-shells.sh when missing (as root); without
    it, the test fails under CORRAL_REQUIRE_NODE=1 (CI) and is skipped with the reason
    otherwise."""
    path = shutil.which(name)
    if path is None:
        done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, check=False)
        path = shutil.which(name)
        if path is None:
            reason = f"{name} is not installed and {INSTALL.name} failed: {done.stderr[-300:]}"
            if REQUIRE:
                pytest.fail(f"CORRAL_REQUIRE_NODE is set: {reason}", False)
            pytest.skip(f"{reason} (set CORRAL_REQUIRE_NODE=1 to fail)")
    return path


def bash_complete(script: Path, words: list[str]) -> list[str]:
    """What bash's Tab offers after `words` (the last one being completed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _corral\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (["corral", ""], ["run", "get", "completion", "version", "--version", "--no-color"]),
        (["corral", "des"], ["describe"]),
        (["corral", "get", ""], ["sessions", "goals", "approvals", "evidence"]),
        (["corral", "get", "sessions", "-o", ""], ["json", "yaml", "wide"]),
        (["corral", "get", "--all"], ["--all-namespaces"]),
        (["corral", "run", "--egress", ""], ["auto", "gateway", "off"]),
        (["corral", "run", "--approvals", ""], ["ask", "approve", "deny", "manual"]),
        (["corral", "freeze", ""], ["session", "agent", "namespace"]),
        (["corral", "evidence", ""], ["check"]),
        (["corral", "evidence", "check", "--rev"], ["--revision"]),
        (["corral", "completion", ""], ["bash", "zsh", "fish"]),
        (["corral", "--no-color", "tr"], ["tree"]),
    ],
)
def test_bash_completes_commands_options_and_their_choices(
    scripts: dict[str, Path], words: list[str], offered: list[str]
) -> None:
    got = bash_complete(scripts["bash"], words)
    assert set(offered) <= set(got), got


def test_bash_offers_every_long_option_of_every_command(scripts: dict[str, Path]) -> None:
    for command in COMMANDS:
        parser = command_parser(command)
        flags = {f for a in parser._actions for f in a.option_strings if f.startswith("--")}
        got = set(bash_complete(scripts["bash"], ["corral", command, "--"]))
        assert flags <= got, (command, flags - got)


def test_bash_completes_a_file_for_an_option_that_takes_one(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "session.yaml").write_text("")
    got = bash_complete(scripts["bash"], ["corral", "run", "-f", f"{tmp_path}/sess"])
    assert got == [str(tmp_path / "session.yaml")]


def test_fish_completes_from_the_same_parsers(scripts: dict[str, Path]) -> None:
    fish = _shell("fish")

    def complete(line: str) -> list[str]:
        done = subprocess.run([fish, "--no-config", "-c", f"source {scripts['fish']}; "
                               f"complete -C '{line}'"], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert "get" in complete("corral ge")
    assert {"sessions", "goals", "approvals", "evidence"} <= set(complete("corral get "))
    assert {"json", "yaml", "wide"} <= set(complete("corral get sessions -o "))
    assert complete("corral run --ap") == ["--approvals"]
    assert {"auto", "gateway", "off"} <= set(complete("corral run --egress "))
    assert "freeze" in complete("kubectl-corral fr")


def zsh_tab(zsh: str, script: Path, line: str, until: str | None = None) -> str:
    """What a zsh at a terminal shows after `line` and a Tab (compinit, then the script): read
    until `until` shows (a loaded machine may take seconds), else for 2 s."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: an interactive zsh without the person's rc files
        os.execve(zsh, [zsh, "-f", "-i"], {"PATH": os.environ["PATH"], "TERM": "dumb",
                                           "HOME": str(script.parent)})  # fmt: skip

    def read(seconds: float, until: bytes | None = None) -> bytes:
        out, deadline = b"", time.monotonic() + seconds
        while time.monotonic() < deadline and (until is None or until not in out):
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
        return out

    try:
        os.write(fd, f"PS1='> '; autoload -Uz compinit; compinit -u; source {script}; "
                     "echo LOADED\n".encode())  # fmt: skip
        assert b"LOADED\r\n" in read(20, b"LOADED\r\n")
        read(0.3)
        os.write(fd, line.encode() + b"\t")
        if until is not None:
            return read(30.0, until.encode()).decode(errors="replace")
        return read(2.0).decode(errors="replace")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("corral ge", "corral get "),  # the one match is completed in place
        ("corral get ", "sessions"),
        ("corral freeze ", "namespace"),
        ("corral run --egress ", "gateway"),
        ("corral get sessions --out", "--output"),
    ],
)
def test_zsh_completes_at_a_terminal(scripts: dict[str, Path], line: str, shown: str) -> None:
    zsh = _shell("zsh")
    assert shown in zsh_tab(zsh, scripts["zsh"], line, shown).replace("\x07", "")
