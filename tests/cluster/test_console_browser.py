"""The console in a real browser (docs/console.md): headless Chromium (Debian's) driven by
playwright-core clicks through a live Session on the real API server, driven by the operator
and the scripted model: Approve and Deny on screen and clickable at 1280, 1920 and 390 px, the
Approval decided with a reason, the work the turn delivered to a real remote (`git daemon`)
read back by the console as a patch, and a person of another namespace seeing nothing of it.
Screenshots land in docs/screenshots/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_dev.controlplane import REPO_ROOT
from tests.unit.custodian._custodian_proc import git, git_daemon

from ._console_fixtures import ConsoleHandle, console, other_namespace  # noqa: F401
from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(300)

SCRIPT = REPO_ROOT / "tests" / "browser" / "console_walkthrough.cjs"
SHOTS = REPO_ROOT / "docs" / "screenshots"
# Outside /tmp, which the local node maps onto each pod's own /tmp volume.
_SERVED = Path.home() / ".cache" / "corral" / "test-repos"
REASON = "reviewed in the console: main has nothing risky"


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


@pytest.fixture
def remote(git_repo: Path) -> Iterator[str]:
    """The test repository as a bare repository behind `git daemon`: a remote the Session
    delivers to and the console reads back from."""
    _SERVED.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="served-", dir=_SERVED))
    try:
        git(base, "clone", "-q", "--bare", str(git_repo), str(base / "shop.git"))
        with git_daemon(base) as url:
            yield url + "shop.git"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_person_approves_a_call_on_any_screen_and_reads_what_it_delivered_in_chromium(
    operator: OperatorHandle,
    console: ConsoleHandle,  # noqa: F811
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
    remote: str,
) -> None:
    modules, chromium = browser()
    name = f"{operator.namespace}-merge"
    command = "printf 'merged main, as approved\\n' > CHANGES.md && git merge --ff-only main"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {
                        "text": "Merging main into the session's branch.",
                        "tool_use": {
                            "name": "bash",
                            "input": {"command": f"{command} && echo MERGED"},
                        },
                    },
                    {"text": "Merged; the branch is up to date."},
                ]
            }
        }
    )
    session = session_doc(name, git_repo)
    session["spec"]["workspace"]["repo"] = remote
    operator.apply(agent_doc(), session)
    operator.wait_phase(name, {"WaitingForHuman"})
    SHOTS.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["node", str(SCRIPT), console.url, str(chromium), console.alice, console.mallory,
         console.namespace, name, console.other, str(SHOTS)],
        capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "NODE_PATH": str(modules)},
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{operator.logs()[-3000:]}"
    assert "walkthrough passed" in done.stdout
    status = operator.session_status(name)
    assert status["phase"] == "Succeeded", status
    # The reason typed in the browser is the Approval's, written with alice's own token.
    listed = operator.cp.kubectl("get", "approvals", "-n", operator.namespace, "-o", "json")
    (approval,) = json.loads(listed.stdout)["items"]
    assert approval["status"]["comment"] == REASON
    # The revision the page showed is the one on the remote's branch.
    revision = status["delivery"]["revision"]
    assert revision in done.stdout
    for shot in ("fleet", "session", "session-phone", "approvals", "session-decided", "changes"):
        assert (SHOTS / f"{shot}.png").stat().st_size > 10_000, shot
