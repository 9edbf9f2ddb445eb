"""The checkout re-run: the init containers run again in the same pod after a node restart, with
the agent's files still in the workspace and its /tmp, and the git credentials mounted.

A real Session (real operator, real API server, the local node) whose Agent has git credentials
for a repository served over HTTP behind Basic auth, so git really asks for them. The agent's
shell plants git traps (tests._git_http.git_traps) in everything it may write: `/tmp/.gitconfig`
(its HOME's), `$HOME/.config/git/config`, the workspace's `.git/config` and `.git/hooks`, with
`core.hooksPath`, `core.fsmonitor`, `core.askPass`, `core.sshCommand`, a credential helper and
`url.*.insteadOf` pointing at a repository of its own; its own `git status` shows them live
(where no credential is). Then the local node restarts, as a node or container runtime would,
and the pod's init containers run again on the same volumes.

No trap may run where the credentials are readable (each would leave a marker saying so, and a
copy of them), the second checkout must come from the real server with the real credentials,
and it must be clean: the real commit on the session branch, nothing of the agent's left.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from corral_dev import stack
from corral_dev._node_host import SHARE_ENV

from .._git_http import STOLEN_PREFIX, TRAP_PREFIX, GitHttp, git_traps
from ..cluster._node_fixtures import TEST_REPOS, LocalNodeHandle
from ..cluster._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)

LIVE = (
    'timeout 30 git -C "$PWD" status --porcelain >/dev/null 2>&1; echo "rc=$?"; '
    'echo "live traps: $(cd "$HOME" && ls corral-trap-* | sed s/corral-trap-//)"'
)

TOKEN = "rerun-git-token-4d8e1a7b"
CREDENTIALS = '"$(dirname "$PWD")/git-credentials/credentials"'


def _git(directory: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(directory), *args],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


def _restart_node(node: LocalNodeHandle, kubeconfig: Path) -> None:
    """Stop the local node (its pods' processes go with it) and start it again on the same
    work directory: it finds the pod bound to it and runs it again, init containers first."""
    node.process.terminate()
    node.process.wait(timeout=60)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SHARE_ENV, str(TEST_REPOS))
        node.process = stack.start_local_node(kubeconfig, node.workdir, node.name, node.log)


def _checkout_status(operator: OperatorHandle, pod: str) -> dict[str, Any]:
    found = operator.get("pod", pod) or {}
    statuses = (found.get("status") or {}).get("initContainerStatuses") or []
    return next((s for s in statuses if s.get("name") == "checkout"), {})


def _finished_since(operator: OperatorHandle, pod: str, since: str) -> dict[str, Any] | None:
    done = (_checkout_status(operator, pod).get("state") or {}).get("terminated") or {}
    return done if done and str(done.get("startedAt", "")) >= since else None


def test_a_checkout_rerun_after_planted_git_traps_runs_none_and_starts_clean(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, tmp_path: Path
) -> None:
    node = operator.node
    assert node is not None
    name = "rerun"
    pod = f"corral-{name}"
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "README.md").write_text("the real repository\n")
    _git(work, "add", "-A")
    _git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "real")
    commit = _git(work, "rev-parse", "HEAD")
    served = tmp_path / "served"
    served.mkdir()
    _git(work, "clone", "-q", "--bare", str(work), str(served / "repo.git"))

    with GitHttp(served, "corral", TOKEN) as server:
        url = f"{server.url}/repo.git"
        credentials_line = server.url.replace("://", f"://corral:{TOKEN}@")
        operator.cp.kubectl(
            "create", "secret", "generic", "checkout-git", "-n", operator.namespace,
            f"--from-literal=credentials={credentials_line}\n",
        )  # fmt: skip
        # The local node shows each volume at its host path (it rewrites the container's paths
        # in its command and env), so the agent names its places as its shell finds them: its
        # HOME (the /tmp volume) and its working directory (the workspace); the credentials as
        # the checkout sees them, beside the workspace (/var/run/corral/git in a real pod).
        plant = git_traps(
            home='"$HOME"', tmp='"$HOME"', workspace='"$PWD"', credentials=CREDENTIALS,
            victim_url=url, marks=['"$HOME"', '"$PWD"'],
        )  # fmt: skip
        scripted_model.load(
            {
                "conversations": {
                    name: [
                        {"tool_use": {"name": "bash", "input": {"command": plant}}},
                        # The traps are live for a git that reads them: the agent's own.
                        {"tool_use": {"name": "bash", "input": {"command": LIVE}}},
                        # Alive while the node restarts under it.
                        {"tool_use": {"name": "bash", "input": {"command": "sleep 240"}}},
                        {"text": "done"},
                    ]
                }
            }
        )
        session = session_doc(name, work, task="Plant the traps.", keepSandbox=True)
        session["spec"]["workspace"]["repo"] = url
        operator.apply(
            agent_doc(
                tools={"allow": ["bash"]},
                credentials={"gitSecretRef": {"name": "checkout-git", "key": "credentials"}},
            ),
            session,
        )
        # The first checkout used the credentials; then the agent planted.
        wait_for("the planting", lambda: len(scripted_model.requests(name)) >= 3 or None, 120)
        assert ("/repo.git/info/refs", "corral") in server.requests
        planted, live = (str(r) for r in scripted_model.requests(name)[1:3])
        assert "planted" in planted, planted[-2000:]
        assert "live traps: workspace-fsmonitor" in live, live[-2000:]
        volumes = node.pod_dir(operator.namespace, pod) / "volumes"
        assert (volumes / "tools-tmp" / ".gitconfig").exists()
        assert (volumes / "workspace" / ".git" / "hooks" / "post-checkout").exists()
        # Where the traps look for the credentials is where the checkout has them.
        assert (volumes / "git-credentials" / "credentials").read_text().strip() == (
            credentials_line
        )
        asked = len(server.requests)

        time.sleep(1.1)  # the node's timestamps are in whole seconds
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _restart_node(node, operator.cp.kubeconfig)
        finished = wait_for(
            "the checkout's second run", lambda: _finished_since(operator, pod, since), 120
        )
        # Read at once, before the restarted containers do anything.
        ws = volumes / "workspace"
        state = {
            "head": _git(ws, "rev-parse", "HEAD"),
            "branch": _git(ws, "rev-parse", "--abbrev-ref", "HEAD"),
            "status": _git(ws, "status", "--porcelain", "--ignored"),
            "files": sorted(p.name for p in ws.iterdir()),
            "config": (ws / ".git" / "config").read_text(),
            "hooks": (ws / ".git" / "hooks").exists(),
        }
        again = server.requests[asked:]

    assert finished["exitCode"] == 0, finished
    # It went to the real server again, and the credentials reached it: no insteadOf applied.
    assert ("/repo.git/info/refs", "corral") in again
    assert ("/repo.git/git-upload-pack", "corral") in again
    # No trap ran where the credentials were readable; nothing of them was copied anywhere;
    # nothing at all ran in the checkout's own HOME.
    readable, stolen, in_checkout_home = [], [], []
    for path in volumes.rglob("*"):
        if path.name.startswith(STOLEN_PREFIX):
            stolen.append(str(path))
        elif path.name.startswith(TRAP_PREFIX):
            if "credentials=readable" in path.read_text(errors="replace"):
                readable.append(str(path))
            if path.is_relative_to(volumes / "checkout-home"):
                in_checkout_home.append(str(path))
    assert (readable, stolen, in_checkout_home) == ([], [], [])
    # The second checkout is clean: the real commit on the session branch, nothing planted.
    assert state["head"] == commit and state["branch"] == f"corral/{name}"
    assert state["status"] == "" and state["files"] == [".git", "README.md"], state
    for planted_key in ("hooksPath", "fsmonitor", "askPass", "sshCommand", "helper", "insteadOf"):
        assert planted_key not in state["config"], state["config"]
    assert state["hooks"] is False
    # The agent's own /tmp was never the checkout's: its traps are still there, unread.
    assert (volumes / "tools-tmp" / ".gitconfig").exists()
