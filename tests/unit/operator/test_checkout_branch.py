"""The checkout refuses a session branch that is the branch its ref names, on the remote.

The operator fails a Session whose ref names its branch outright (`main` onto `main`); only
the remote knows where `HEAD` points, so the checkout, which has the clone, refuses that case
(and the others again). These run the init container's real command (sh + git) against a
real repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral_operator.builders.podbuilder import build_pod
from corral_operator.settings import OperatorSettings
from tests._objects import agent, session

SETTINGS = OperatorSettings(image="corral/sandbox:test")
ANYWHERE = {"branches": ["**"]}  # patterns that let only the ref rule refuse


def _git(*args: str, cwd: Path) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    """A repository whose default branch (HEAD) is `trunk`, with a `feature` branch."""
    repo = tmp_path / "origin"
    repo.mkdir()
    _git("init", "-q", "-b", "trunk", cwd=repo)
    (repo / "README").write_text("hello\n")
    _git("add", "README", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one", cwd=repo)
    _git("branch", "feature", cwd=repo)
    return repo


def _checkout(
    tmp_path: Path, origin: Path, ref: str, branch: str
) -> subprocess.CompletedProcess[str]:
    dest = tmp_path / "ws"
    dest.mkdir(exist_ok=True)
    ws = {"repo": str(origin), "ref": ref, "branch": branch}
    pod = build_pod(agent(workspace=ANYWHERE), session(workspace=ws), SETTINGS)
    init = next(c for c in pod["spec"]["initContainers"] if c["name"] == "checkout")
    # The checkout is made on the session branch itself, the one the custodian pushes.
    assert branch in init["args"]
    args = [a if a != "/workspace" else str(dest) for a in init["args"]]
    return subprocess.run(
        [*init["command"], *args],
        capture_output=True,
        text=True,
        timeout=20,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("ref", "branch"),
    [
        ("HEAD", "trunk"),  # only the remote knows HEAD is trunk
        ("trunk", "trunk"),
        ("refs/heads/feature", "feature"),
        ("origin/feature", "feature"),
    ],
)
def test_a_session_branch_the_ref_names_is_refused(
    tmp_path: Path, origin: Path, ref: str, branch: str
) -> None:
    done = _checkout(tmp_path, origin, ref, branch)
    assert done.returncode == 3, done.stderr
    assert f"the session branch '{branch}' is the branch spec.workspace.ref '{ref}'" in (
        done.stderr
    )
    # Refused before the checkout: no file of the ref is in the workspace.
    assert not (tmp_path / "ws" / "README").exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ref", ["HEAD", "trunk", "feature"])
def test_another_branch_checks_out_onto_the_session_branch(
    tmp_path: Path, origin: Path, ref: str
) -> None:
    done = _checkout(tmp_path, origin, ref, "corral/topic")
    assert done.returncode == 0, done.stderr
    assert _git("rev-parse", "--abbrev-ref", "HEAD", cwd=tmp_path / "ws") == "corral/topic"
    assert (tmp_path / "ws" / "README").read_text() == "hello\n"
