"""The malicious agent against delivery: symlinks planted at `.git/objects/info/alternates` and
`.git/packed-refs` pointing at every credential file the custodian holds, through the Menu's
`push` and through turn-end delivery.

Against a custodian that fetched from the workspace, git ran in the agent's repository as the
custodian's uid, followed the symlinks and printed the files in its errors (`object directory
.../sk-ant-... does not exist`, `unexpected line in .git/packed-refs: <secret>`), which reached
the tool result, the delivery record and `Session.status.delivery`. Now the custodian does not
mount the workspace at all: the tools side (the agent's uid, which cannot read those files)
writes a bundle, and the custodian reads only that. The symlinks point where the custodian's
files really are on the local node (its volumes' host paths, `/var/run/corral/...` in a real
pod, which the last plant uses), so each would have worked before.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .._scripted import tool_results
from ..cluster._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    wait_for,
)
from ..unit.custodian._custodian_proc import git_daemon

pytestmark = pytest.mark.timeout(420)

REPOS = Path.home() / ".cache" / "corral" / "test-repos"
MENU = "mcp__corral__"
# The credential files of the custodian: (name, volume, file, the path in a real pod).
CREDENTIAL_FILES = [
    ("model-key", "model-key", "key", "/var/run/corral/model/key"),
    ("git-credentials", "git-credentials", "credentials", "/var/run/corral/git/credentials"),
    ("service-account-token", "kube-token", "token", "/var/run/corral/kube/token"),
    ("wire-token", "wire", "token", "/var/run/corral/wire/token"),
    ("custodian-credential", "wire", "custodian", "/var/run/corral/wire/custodian"),
]
PLANTS = {"alternates": ".git/objects/info/alternates", "packed-refs": ".git/packed-refs"}


def _forms(value: str) -> set[str]:
    """The value and its usual encodings, any of which would be a leak."""
    raw = value.encode()
    return {
        value,
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        raw.hex(),
        quote(value, safe=""),
        json.dumps(value)[1:-1],
    }


def _leaks(text: str, secrets: dict[str, str]) -> list[str]:
    return [name for name, value in secrets.items() if any(f in text for f in _forms(value))]


@pytest.fixture
def served() -> Iterator[tuple[Path, str]]:
    """A bare repository served by `git daemon` (a remote the custodian pushes to)."""
    REPOS.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.realpath(REPOS)) / f"served-{os.getpid()}-{time.monotonic_ns()}"
    seed = base / "seed"
    run: dict[str, Any] = {"check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], **run)
    (seed / "README.md").write_text("# served\n")
    subprocess.run(["git", "-C", str(seed), "add", "README.md"], **run)
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "-C", str(seed), *ident, "commit", "-qm", "init"], **run)
    bare = base / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(seed), str(bare)], **run)
    try:
        with git_daemon(base) as url:
            yield bare, url + "repo.git"
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _secret(name: str, key: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {key: value},
    }


def _plant_step(location: str, target: str, label: str) -> str:
    """Plant one symlink (the previous one removed), show what the agent's own uid reads
    there, and commit a change for the push that follows."""
    return "\n".join(
        [
            "rm -f .git/objects/info/alternates .git/packed-refs",
            f"ln -s '{target}' {location}",
            f'echo "READ {label} $(cat {location} 2>&1 | head -c 200)"',
            f"echo {label} > {label}.txt && git add {label}.txt",
            f"git -c user.name=a -c user.email=a@a commit -qm {label} 2>&1 | head -c 300",
            "echo REV=$(git rev-parse HEAD)",
        ]
    )


def _custodian_pid(session: str, namespace: str) -> int | None:
    """The custodian of this namespace's Session: the name alone is not enough, since the real
    node's tier (run beside this one) has a Session of the same name whose custodian is a
    process of this machine too."""
    wanted = (
        f"CORRAL_SESSION_NAME={session}\0".encode(),
        f"CORRAL_SESSION_NAMESPACE={namespace}\0".encode(),
    )
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"corral-custodian" in cmdline and all(w in environ for w in wanted):
            return int(proc.name)
    return None


def test_symlinks_to_the_custodians_credentials_leak_nothing_through_push_or_delivery(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    served: tuple[Path, str],
) -> None:
    assert operator.node is not None
    bare, url = served
    name = "symlinker"
    pod = f"corral-{name}"
    branch = f"corral/{name}"
    model_key = f"sk-ant-canary-{uuid.uuid4().hex}"
    git_credential = f"https://agent:ghp{uuid.uuid4().hex}@git.example.invalid"
    operator.cp.kubectl(
        "apply", "-n", operator.namespace, "-f", "-",
        input=json.dumps({
            "apiVersion": "v1", "kind": "List",
            "items": [
                _secret("symlink-model", "key", model_key),
                _secret("symlink-git", "credentials", git_credential + "\n"),
            ],
        }),
    )  # fmt: skip
    # First a wait, so the plants can name the custodian's files once the pod has them: the
    # agent waits for a file this test drops into the workspace when the script is ready.
    wait = "for i in $(seq 900); do [ -e .go ] && break; sleep 0.2; done; rm -f .go; echo go"
    scripted_model.load(
        {"conversations": {name: [{"tool_use": {"name": "bash", "input": {"command": wait}}}]}}
    )
    operator.apply(
        agent_doc(
            tools={"allow": ["bash", f"{MENU}*"]},
            credentials={
                "modelSecretRef": {"name": "symlink-model", "key": "key"},
                "gitSecretRef": {"name": "symlink-git", "key": "credentials"},
            },
        ),
        {
            "apiVersion": "corral.dev/v1alpha1",
            "kind": "Session",
            "metadata": {"name": name},
            "spec": {
                "agentRef": "coder",
                "task": "Deliver the work.",
                "workspace": {"repo": url, "ref": "main"},
                "keepSandbox": True,
            },
        },
    )

    def volumes() -> Path | None:
        try:
            found = operator.node.pod_dir(operator.namespace, pod) / "volumes"  # type: ignore[union-attr]
        except FileNotFoundError:
            return None
        ready = all((found / volume / file).is_file() for _, volume, file, _ in CREDENTIAL_FILES)
        return found if ready else None

    vols = wait_for("the sandbox pod's volumes", volumes, 90)
    files = {label: vols / volume / file for label, volume, file, _ in CREDENTIAL_FILES}
    secrets = {label: path.read_text().strip() for label, path in files.items()}
    assert secrets["model-key"] == model_key and secrets["git-credentials"] == git_credential
    assert all(len(v) >= 8 for v in secrets.values()), secrets

    # The custodian cannot open the workspace: it is not in its mount namespace at all.
    pid = wait_for("the custodian process", lambda: _custodian_pid(name, operator.namespace), 60)
    workspace = vols / "workspace"
    assert (workspace / ".git").exists()
    assert not os.path.lexists(f"/proc/{pid}/root{workspace}/.git")
    assert not os.path.lexists(f"/proc/{pid}/root/workspace")

    steps: list[dict[str, Any]] = []
    labels: list[str] = []
    for label, _, _, _ in CREDENTIAL_FILES:
        for plant, location in PLANTS.items():
            step = f"{label}-{plant}"
            labels.append(step)
            command = _plant_step(location, str(files[label]), step)
            steps.append({"tool_use": {"name": "bash", "input": {"command": command}}})
            steps.append({"tool_use": {"name": MENU + "push", "input": {}}})
    # Turn-end delivery with both plants in place, at the paths of a real pod; the change is
    # left uncommitted, for the turn's own commit.
    final = "\n".join(
        [
            "rm -f .git/objects/info/alternates .git/packed-refs",
            "ln -s /var/run/corral/model/key .git/objects/info/alternates",
            f"ln -s '{files['git-credentials']}' .git/packed-refs",
            "echo last > last.txt",
            "echo planted",
        ]
    )
    steps.append({"tool_use": {"name": "bash", "input": {"command": final}}})
    steps.append({"text": "Delivered."})
    # The first reply (the wait) must have gone out before the script is replaced.
    wait_for("the agent's wait", lambda: len(scripted_model.requests(name)) >= 1 or None, 120)
    scripted_model.load({"conversations": {name: steps}})
    (workspace / ".go").write_text("")

    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=300)
    results = tool_results(scripted_model.requests(name))
    seen = "\n".join(results)
    assert status["phase"] == "Succeeded", (status, seen[-3000:])
    assert len(results) == 1 + 2 * len(labels) + 1, seen

    # Every plant: the agent's own uid reads nothing there, and the push still delivers the
    # revision it made, with no credential text in its result.
    revisions: list[str] = []
    for i, label in enumerate(labels):
        planted, pushed = results[1 + 2 * i], results[2 + 2 * i]
        assert f"READ {label}" in planted and "No such file" in planted, planted
        revision = planted.split("REV=")[1].split()[0]
        revisions.append(revision)
        assert "pushed" in pushed and revision in pushed, (label, pushed)
        assert not _leaks(planted + pushed, secrets), (label, planted, pushed)
    assert "planted" in results[-1]

    # Turn end: delivered past the plants, and the record says nothing secret.
    delivery = status["delivery"]
    assert delivery["state"] == "Delivered", delivery
    final_revision = delivery["revision"]
    assert final_revision not in revisions
    remote_head = subprocess.run(
        ["git", "-C", str(bare), "rev-parse", f"refs/heads/{branch}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert remote_head == final_revision
    parent = subprocess.run(
        ["git", "-C", str(bare), "rev-parse", f"{final_revision}~1"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert parent == revisions[-1]

    # Nothing secret anywhere a party without the credentials reads: the model's requests,
    # the Session's status, the custodian's and every container's log, the operator's log,
    # and every object on the remote.
    # (The bodies: the provider is meant to receive the model key in a header.)
    requests = json.dumps([r["body"] for r in scripted_model.requests(name)])
    logs = operator.node.pod_dir(operator.namespace, pod) / "logs"
    container_logs = {f.name: f.read_text(errors="replace") for f in logs.glob("*.log")}
    assert "custodian.log" in container_logs, sorted(container_logs)
    objects = subprocess.run(
        ["git", "-C", str(bare), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True, check=True,
    ).stdout.decode(errors="replace")  # fmt: skip
    places = {
        "the tool results": seen,
        "the model's requests": requests,
        "Session.status": json.dumps(operator.session_status(name)),
        "the operator's log": operator.logs(),
        "the remote's objects": objects,
        **{f"the log {log}": text for log, text in container_logs.items()},
    }
    leaked = {where: found for where, text in places.items() if (found := _leaks(text, secrets))}
    assert not leaked, leaked
