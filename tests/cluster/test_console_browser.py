"""The console in a real browser (docs/console.md): headless Chromium (Debian's) driven by
playwright-core clicks through a live Session on the real API server, driven by the operator
and the scripted model, decides its Approval, and checks a person of another namespace sees
nothing of it. Screenshots land in docs/screenshots/."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from corral_dev.controlplane import REPO_ROOT

from ._console_fixtures import ConsoleHandle, console, other_namespace  # noqa: F401
from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(300)

SCRIPT = REPO_ROOT / "tests" / "browser" / "console_walkthrough.cjs"
SHOTS = REPO_ROOT / "docs" / "screenshots"


def browser() -> tuple[Path, Path]:
    """playwright-core's node_modules and the chromium binary, installed by the project's own
    script. Not installable is a failure, never a skip."""
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "install-browser.sh")],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"hack/install-browser.sh could not install the browser:\n{done.stderr}")
    modules, chromium = done.stdout.strip().splitlines()[-2:]
    return Path(modules) / "node_modules", Path(chromium)


def test_a_person_watches_a_live_session_and_approves_its_call_in_chromium(
    operator: OperatorHandle,
    console: ConsoleHandle,  # noqa: F811
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
) -> None:
    modules, chromium = browser()
    name = f"{operator.namespace}-merge"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {
                        "text": "Merging main into the session's branch.",
                        "tool_use": {
                            "name": "bash",
                            "input": {"command": "git merge --ff-only main && echo MERGED"},
                        },
                    },
                    {"text": "Merged; the branch is up to date."},
                ]
            }
        }
    )
    operator.apply(agent_doc(), session_doc(name, git_repo))
    operator.wait_phase(name, {"WaitingForHuman"})
    SHOTS.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["node", str(SCRIPT), console.url, str(chromium), console.alice, console.mallory,
         console.namespace, name, str(SHOTS)],
        capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "NODE_PATH": str(modules)},
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{operator.logs()[-3000:]}"
    assert "walkthrough passed" in done.stdout
    status = operator.session_status(name)
    assert status["phase"] == "Succeeded", status
    for shot in ("fleet", "session", "approvals", "session-decided"):
        assert (SHOTS / f"{shot}.png").stat().st_size > 10_000, shot
