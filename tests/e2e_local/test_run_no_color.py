"""`corral run` on a terminal (a pty): its live view is in colour, and with $NO_COLOR (any
non-empty value) or --no-color it prints no colour or style sequence at all (no-color.org);
the status panel still redraws in place."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import FIX, run_argv, run_env, write_session

pytestmark = pytest.mark.timeout(120)

# Select Graphic Rendition: colour, bold, dim... (cursor movement is not one of them).
SGR = re.compile(rb"\x1b\[[0-9;]*m")


def on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    leader, follower = pty.openpty()
    process = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out, deadline = b"", time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal's other end closed: the run is over
                    break
                if not chunk:
                    break
                out += chunk
            elif process.poll() is not None:
                break
        return process.wait(timeout=30), out
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)


@pytest.mark.parametrize(
    ("how", "coloured"), [("plain", True), ("NO_COLOR", False), ("--no-color", False)]
)
def test_the_live_view_honours_no_color(
    demo_workspace: Path, tmp_path: Path, how: str, coloured: bool
) -> None:
    session, scenario = write_session(
        tmp_path, scenario_replies=[FIX, {"text": "Fixed."}], evaluation=None
    )
    argv = run_argv(session, demo_workspace, tmp_path / "state", "--scenario", str(scenario))
    env = run_env() | {"TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    if how == "NO_COLOR":
        env["NO_COLOR"] = "1"
    elif how == "--no-color":
        argv.append("--no-color")
    code, out = on_a_terminal(argv, env)
    assert code == 0, out.decode(errors="replace")[-2000:]
    assert b"Succeeded: " in out  # the outcome line, on the terminal
    assert bool(SGR.search(out)) is coloured, SGR.findall(out)[:5]
