"""The custodian against the real API server, under the chart's sandbox RBAC.

The custodian runs as a real process with a token of the chart's sandbox ServiceAccount
(rendered from charts/corral with helm), so every Session and Approval it creates, and every
request the API server refuses, is what a sandbox pod's custodian would meet.
"""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_custodian._digest import action_digest, canonical_json
from corral_dev.controlplane import API_AUDIENCE, REPO_ROOT, ControlPlane
from tests.unit.custodian._custodian_proc import running_custodian

pytestmark = pytest.mark.timeout(120)

SANDBOX_SA = "corral-sandbox"
ORCHESTRATOR = {
    "identity": "You orchestrate.",
    "model": "claude-haiku-4-5",
    "orchestrator": True,
    "limits": {"maxTurns": 5, "maxChildrenPerTurn": 2},
}


def kubectl_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(cp.kubectl(*args, "-o", "json").stdout)
    return result


def apply(cp: ControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    cp.kubectl("apply", "-f", "-", input=json.dumps(obj))
    meta = obj["metadata"]
    return kubectl_json(cp, "get", obj["kind"].lower(), meta["name"], "-n", meta["namespace"])


def patch_status(cp: ControlPlane, kind: str, name: str, ns: str, status: dict[str, Any]) -> None:
    cp.kubectl(
        "patch", kind, name, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def session(name: str, ns: str, parent: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "agentRef": "coder",
        "task": "do the thing",
        "workspace": {"repo": "https://example.invalid/repo.git", "ref": "main"},
    }
    if parent is not None:
        spec["parentRef"] = {"name": parent["metadata"]["name"], "uid": parent["metadata"]["uid"]}
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


@pytest.fixture
def sandbox_token(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Path:
    """The chart's sandbox identity in this namespace, and a token for it."""
    rendered = subprocess.run(
        [
            str(control_plane.bin_dir / "helm"), "template", "corral",
            str(REPO_ROOT / "charts" / "corral"),
            "--kube-version", "1.34.4", "--show-only", "templates/sandbox-rbac.yaml",
            "--set", f"sandboxNamespaces={{{namespace}}}",
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=rendered)
    token = control_plane.kubectl(
        "create", "token", SANDBOX_SA, "-n", namespace, "--audience", API_AUDIENCE,
        "--duration", "10m",
    ).stdout.strip()  # fmt: skip
    path = tmp_path / "sa-token"
    path.write_text(token)
    return path


Custodian = Callable[..., AbstractContextManager[str]]


@pytest.fixture
def custodian(
    control_plane: ControlPlane, namespace: str, sandbox_token: Path, tmp_path: Path
) -> Custodian:
    def start(sess: dict[str, Any], agent: dict[str, Any] | None = None, **env: str) -> Any:
        return running_custodian(
            {
                "CORRAL_KUBE_API": control_plane.server,
                "CORRAL_KUBE_TOKEN_FILE": str(sandbox_token),
                "CORRAL_KUBE_CA_FILE": str(control_plane.ca_file),
                "CORRAL_SESSION_NAME": sess["metadata"]["name"],
                "CORRAL_SESSION_NAMESPACE": namespace,
                "CORRAL_SESSION_UID": sess["metadata"]["uid"],
                "CORRAL_AGENT_SPEC_JSON": json.dumps(agent or ORCHESTRATOR),
                "CORRAL_STATE_DIR": str(tmp_path / f"state-{sess['metadata']['name']}"),
                **env,
            },
            tmp_path / "custodian.log",
        )

    return start


def call(url: str, tool: str, body: dict[str, Any], submission: str = "") -> dict[str, Any]:
    headers = {"X-Corral-Submission": submission} if submission else {}
    response = httpx.post(f"{url}/agents/conv/tools/{tool}", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def menu_names(url: str) -> list[str]:
    return [t["name"] for t in httpx.get(f"{url}/agents/conv/surface", timeout=30).json()["tools"]]


def test_children_are_created_owned_one_level_down_and_capped_per_turn(
    control_plane: ControlPlane, namespace: str, custodian: Custodian
) -> None:
    parent = apply(control_plane, session("lead", namespace))
    patch_status(control_plane, "session", "lead", namespace, {"turns": 3})
    with custodian(parent) as url:
        assert "spawn_child" in menu_names(url)
        first = call(url, "spawn_child", {"task": "write tests", "maxTurns": 50, "maxDepth": 9})
        assert first["isError"] is False, first
        answer = json.loads(first["content"])
        assert answer["ignored"] == ["maxDepth"]
        child = kubectl_json(control_plane, "get", "session", answer["child"], "-n", namespace)
        assert child["spec"]["parentRef"] == {"name": "lead", "uid": parent["metadata"]["uid"]}
        owner = child["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("Session", parent["metadata"]["uid"])
        assert child["metadata"]["labels"]["corral.dev/depth"] == "1"
        # 5 turns, 3 settled: the child may have 2, whatever the model asked for.
        assert child["metadata"]["annotations"]["corral.dev/max-turns"] == "2"

        assert call(url, "spawn_child", {"task": "second"})["isError"] is False
        # The cap is 2 per turn; a forged submission header does not open a new turn.
        third = call(url, "spawn_child", {"task": "third"}, submission="forged-new-turn")
        assert third["isError"] is True and "2 of 2" in third["content"]

    # The count lives in the cluster: a restarted custodian still refuses the third child.
    with custodian(parent) as url:
        again = call(url, "spawn_child", {"task": "third, after a restart"})
        assert again["isError"] is True and "2 of 2" in again["content"]

        # The operator settles the turn: a new turn may start children again.
        patch_status(control_plane, "session", "lead", namespace, {"turns": 4})
        assert call(url, "spawn_child", {"task": "next turn"})["isError"] is False

        children = kubectl_json(
            control_plane, "get", "sessions", "-n", namespace,
            "-l", f"corral.dev/parent-uid={parent['metadata']['uid']}",
        )["items"]  # fmt: skip
        assert len(children) == 3

        tree = call(url, "walk_tree", {})["content"]
        assert tree.splitlines()[0] == "lead (this session)" and tree.count("- lead-child-") == 3

        # Children finish; wait_children sees it.
        waiting = call(url, "wait_children", {"mode": "all"})
        assert waiting["endsTurn"] is True
        for item in children:
            patch_status(
                control_plane, "session", item["metadata"]["name"], namespace,
                {"phase": "Succeeded"},
            )  # fmt: skip
        done = call(url, "wait_children", {"mode": "all"})
        assert done["endsTurn"] is False and "3/3 finished" in done["content"]

        # A model cannot peek at sessions that are not its children, nor walk the API path.
        assert call(url, "child_status", {"name": "lead"})["isError"] is True
        assert call(url, "child_status", {"name": "../../secrets"})["isError"] is True

        # The Menu is read afresh: once every turn is spent, spawn_child is gone.
        patch_status(control_plane, "session", "lead", namespace, {"turns": 5})
        assert "spawn_child" not in menu_names(url)
        assert "no turns left" in call(url, "spawn_child", {"task": "late"})["content"]


def test_depth_is_counted_from_the_real_tree_and_capped_at_three(
    control_plane: ControlPlane, namespace: str, custodian: Custodian
) -> None:
    root = apply(control_plane, session("root", namespace))
    d1 = apply(control_plane, session("d1", namespace, root))
    d2 = apply(control_plane, session("d2", namespace, d1))
    d3 = apply(control_plane, session("d3", namespace, d2))
    with custodian(d3) as url:
        assert "spawn_child" not in menu_names(url)
        refused = call(url, "spawn_child", {"task": "deeper", "depth": 0})
        assert refused["isError"] is True and "depth 4" in refused["content"]
    with custodian(d2) as url:
        made = call(url, "spawn_child", {"task": "last level"})
        assert made["isError"] is False and json.loads(made["content"])["depth"] == 3


def test_the_sandbox_identity_cannot_decide_read_secrets_or_leave_its_namespace(
    control_plane: ControlPlane, namespace: str, sandbox_token: Path
) -> None:
    control_plane.kubectl("create", "secret", "generic", "model-key", "-n", namespace,
                          "--from-literal=key=sk-secret")  # fmt: skip
    token = sandbox_token.read_text()
    with httpx.Client(
        base_url=control_plane.server,
        verify=ssl.create_default_context(cafile=str(control_plane.ca_file)),
        headers={"Authorization": f"Bearer {token}"},
    ) as api:
        assert api.get(f"/api/v1/namespaces/{namespace}/secrets/model-key").status_code == 403
        assert api.get("/apis/corral.dev/v1alpha1/namespaces/default/sessions").status_code == 403
        assert (
            api.get(f"/apis/corral.dev/v1alpha1/namespaces/{namespace}/sessions").status_code == 200
        )
        decide = api.patch(
            f"/apis/corral.dev/v1alpha1/namespaces/{namespace}/approvals/any/status",
            content=json.dumps({"status": {"decision": "Approved"}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert decide.status_code == 403


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t",
             "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"},
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repos(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    work = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    (work / "a.txt").write_text("base\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-qm", "base")
    git(work, "push", "-q", "origin", "HEAD:main")
    git(work, "checkout", "-qb", "corral/lander")
    (work / "a.txt").write_text("change\n")
    git(work, "commit", "-qam", "change")
    yield work, remote


def test_land_needs_an_approval_of_this_exact_call_by_this_session_and_pass_evidence(
    control_plane: ControlPlane,
    namespace: str,
    custodian: Custodian,
    repos: tuple[Path, Path],
) -> None:
    work, remote = repos
    revision = git(work, "rev-parse", "HEAD")
    me = apply(control_plane, session("lander", namespace))
    uid = me["metadata"]["uid"]
    args = {"target": "main", "revision": revision}
    digest = action_digest("land", args)
    env = {
        "CORRAL_WORKSPACE": str(work),
        "CORRAL_SESSION_BRANCH": "corral/lander",
        "CORRAL_LAND_CHECK": "unit",
    }
    leaf = {"identity": "x", "model": "claude-haiku-4-5"}
    with custodian(me, leaf, **env) as url:
        asked = call(url, "land", args)
        assert asked["isError"] is False and asked["endsTurn"] is True
        approval_name = json.loads(asked["content"])["approval"]
        approval = kubectl_json(control_plane, "get", "approval", approval_name, "-n", namespace)
        assert approval["spec"]["sessionRef"] == {"name": "lander", "uid": uid}
        assert approval["spec"]["action"]["digest"] == digest
        assert approval["metadata"]["ownerReferences"][0]["uid"] == uid

        pending = call(url, "land", args)
        assert pending["isError"] is True and "awaits" in pending["content"]
        # The harness's approval port polls the decision through the custodian.
        polled = httpx.get(f"{url}/approvals/{approval_name}", timeout=30)
        assert polled.json() == {"approval": approval_name, "decision": "Pending"}

        # A stale approval: same name and digest, another session uid, already Approved.
        stale = {
            "apiVersion": "corral.dev/v1alpha1",
            "kind": "Approval",
            "metadata": {"name": "stale", "namespace": namespace},
            "spec": {
                "sessionRef": {"name": "lander", "uid": "00000000-0000-0000-0000-000000000000"},
                "action": {"tool": "land", "arguments": canonical_json(args), "digest": digest},
            },
        }
        apply(control_plane, stale)
        patch_status(control_plane, "approval", "stale", namespace, {"decision": "Approved"})
        still = call(url, "land", args)
        assert still["isError"] is True and "awaits" in still["content"]
        assert httpx.get(f"{url}/approvals/stale", timeout=30).status_code == 404
        assert git(remote, "rev-parse", "main") != revision

        # A human approves the real one; the configured check has no Pass yet.
        patch_status(control_plane, "approval", approval_name, namespace, {"decision": "Approved"})
        decided = httpx.get(f"{url}/approvals/{approval_name}", timeout=30).json()
        assert decided["decision"] == "Approved"
        no_evidence = call(url, "land", args)
        assert no_evidence["isError"] is True and "no Pass Evidence" in no_evidence["content"]

        evidence = {
            "apiVersion": "corral.dev/v1alpha1",
            "kind": "Evidence",
            "metadata": {"name": "unit-pass", "namespace": namespace},
            "spec": {"repo": str(remote), "revision": revision, "check": "unit", "command": "true"},
        }
        apply(control_plane, evidence)
        patch_status(control_plane, "evidence", "unit-pass", namespace, {"verdict": "Pass"})

        # The approval is for this revision only: another revision is a new question.
        other = call(url, "land", {"target": "main", "revision": "f" * 40})
        assert other["endsTurn"] is True and json.loads(other["content"])["approval"]

        landed = call(url, "land", args)
        assert landed["isError"] is False, landed
        assert git(remote, "rev-parse", "main") == revision
