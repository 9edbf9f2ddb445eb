"""The custodian against the real API server, under the chart's sandbox RBAC.

The custodian runs as a real process with a token of the chart's sandbox ServiceAccount
(rendered from charts/corral with helm), so every Session and Approval it creates, and every
request the API server refuses, is what a sandbox pod's custodian would meet. It reads its
Agent and its Session from the API server, live.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_api.digest import check_definition_digest
from corral_api.labels import evidence_labels
from corral_custodian._digest import action_digest, canonical_json
from corral_dev.controlplane import API_AUDIENCE, REPO_ROOT, ControlPlane
from tests._objects import evidence
from tests.unit.custodian._bundle_rig import send_head
from tests.unit.custodian._custodian_proc import Custodian, git_daemon, running_custodian

pytestmark = pytest.mark.timeout(120)

SANDBOX_SA = "corral-sandbox"
ORCHESTRATOR = {
    "identity": "You orchestrate.",
    "model": "claude-haiku-4-5",
    "orchestrator": True,
    "limits": {"maxTurns": 5, "maxChildrenPerTurn": 2},
    "tools": {"allow": ["mcp__corral__*"]},
}
REPO = "https://example.invalid/repo.git"


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


def session(
    name: str, ns: str, parent: dict[str, Any] | None = None, repo: str = REPO
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "agentRef": "coder",
        "task": "do the thing",
        "workspace": {"repo": repo, "ref": "main"},
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


def agent_doc(ns: str, spec: dict[str, Any], name: str = "coder") -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


Start = Callable[..., AbstractContextManager[Custodian]]


@pytest.fixture
def custodian(
    control_plane: ControlPlane, namespace: str, sandbox_token: Path, tmp_path: Path
) -> Start:
    """Start a custodian for a Session; its Agent `coder` is applied to the cluster first and
    read from there by the custodian (CORRAL_AGENT_NAME), not given in its environment."""

    def start(sess: dict[str, Any], agent: dict[str, Any] | None = None, **env: str) -> Any:
        apply(control_plane, agent_doc(namespace, agent or ORCHESTRATOR))
        return running_custodian(
            {
                "CORRAL_KUBE_API": control_plane.server,
                "CORRAL_KUBE_TOKEN_FILE": str(sandbox_token),
                "CORRAL_KUBE_CA_FILE": str(control_plane.ca_file),
                "CORRAL_SESSION_NAME": sess["metadata"]["name"],
                "CORRAL_SESSION_NAMESPACE": namespace,
                "CORRAL_SESSION_UID": sess["metadata"]["uid"],
                "CORRAL_AGENT_NAME": "coder",
                "CORRAL_STATE_DIR": str(tmp_path / f"state-{sess['metadata']['name']}"),
                **env,
            },
            tmp_path / "custodian.log",
        )

    return start


def call(
    custodian: Custodian, tool: str, body: dict[str, Any], submission: str = ""
) -> dict[str, Any]:
    headers = {**custodian.headers, **({"X-Corral-Submission": submission} if submission else {})}
    response = httpx.post(
        f"{custodian.url}/agents/conv/tools/{tool}", json=body, headers=headers, timeout=30
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def menu_names(custodian: Custodian) -> list[str]:
    response = httpx.get(
        f"{custodian.url}/agents/conv/surface", headers=custodian.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    return [t["name"] for t in response.json()["tools"]]


def test_children_are_created_owned_one_level_down_and_capped_per_turn(
    control_plane: ControlPlane, namespace: str, custodian: Start
) -> None:
    parent = apply(control_plane, session("lead", namespace))
    patch_status(control_plane, "session", "lead", namespace, {"turns": 3})
    with custodian(parent) as running:
        assert "spawn_child" in menu_names(running)
        first = call(running, "spawn_child", {"task": "write tests", "maxTurns": 50, "maxDepth": 9})
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

        assert call(running, "spawn_child", {"task": "second"})["isError"] is False
        # The cap is 2 per turn; a forged submission header does not open a new turn.
        third = call(running, "spawn_child", {"task": "third"}, submission="forged-new-turn")
        assert third["isError"] is True and "2 of 2" in third["content"]

    # The count lives in the cluster: a restarted custodian still refuses the third child.
    with custodian(parent) as running:
        again = call(running, "spawn_child", {"task": "third, after a restart"})
        assert again["isError"] is True and "2 of 2" in again["content"]

        # The operator settles the turn: a new turn may start children again.
        patch_status(control_plane, "session", "lead", namespace, {"turns": 4})
        assert call(running, "spawn_child", {"task": "next turn"})["isError"] is False

        children = kubectl_json(
            control_plane, "get", "sessions", "-n", namespace,
            "-l", f"corral.dev/parent-uid={parent['metadata']['uid']}",
        )["items"]  # fmt: skip
        assert len(children) == 3

        tree = call(running, "walk_tree", {})["content"]
        assert tree.splitlines()[0] == "lead (this session)" and tree.count("- lead-child-") == 3

        # Children finish; wait_children sees it.
        waiting = call(running, "wait_children", {"mode": "all"})
        assert waiting["endsTurn"] is True
        for item in children:
            patch_status(
                control_plane, "session", item["metadata"]["name"], namespace,
                {"phase": "Succeeded"},
            )  # fmt: skip
        done = call(running, "wait_children", {"mode": "all"})
        assert done["endsTurn"] is False and "3/3 finished" in done["content"]

        # A model cannot peek at sessions that are not its children, nor walk the API path.
        assert call(running, "child_status", {"name": "lead"})["isError"] is True
        assert call(running, "child_status", {"name": "../../secrets"})["isError"] is True

        # The Menu is read afresh: once every turn is spent, spawn_child is gone.
        patch_status(control_plane, "session", "lead", namespace, {"turns": 5})
        assert "spawn_child" not in menu_names(running)
        assert "no turns left" in call(running, "spawn_child", {"task": "late"})["content"]


def test_depth_is_counted_from_the_real_tree_and_capped_at_three(
    control_plane: ControlPlane, namespace: str, custodian: Start
) -> None:
    root = apply(control_plane, session("root", namespace))
    d1 = apply(control_plane, session("d1", namespace, root))
    d2 = apply(control_plane, session("d2", namespace, d1))
    d3 = apply(control_plane, session("d3", namespace, d2))
    with custodian(d3) as running:
        assert "spawn_child" not in menu_names(running)
        refused = call(running, "spawn_child", {"task": "deeper", "depth": 0})
        assert refused["isError"] is True and "depth 4" in refused["content"]
    with custodian(d2) as running:
        made = call(running, "spawn_child", {"task": "last level"})
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
def repos(tmp_path: Path) -> Iterator[tuple[Path, Path, str]]:
    """A workspace, its bare remote, and the remote's git:// URL (a git daemon): the custodian
    pushes only to network remotes."""
    served = tmp_path / "served"
    served.mkdir()
    remote = served / "remote.git"
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
    with git_daemon(served) as base:
        yield work, remote, base + "remote.git"


def evidence_doc(
    ns: str, name: str, revision: str, repo: str, command: str, digest_command: str
) -> dict[str, Any]:
    """The `unit` check's Evidence as the operator labels it; its definition digest is that of
    `digest_command`."""
    return evidence(
        name,
        namespace=ns,
        labels=evidence_labels("unit", revision, repo),
        repo=repo,
        revision=revision,
        command=command,
        digest=check_definition_digest(digest_command, None),
    )


def test_land_needs_an_approval_of_this_exact_call_by_this_session_and_pass_evidence(
    control_plane: ControlPlane,
    namespace: str,
    custodian: Start,
    repos: tuple[Path, Path, str],
) -> None:
    work, remote, url = repos
    revision = git(work, "rev-parse", "HEAD")
    me = apply(control_plane, session("lander", namespace, repo=url))
    uid = me["metadata"]["uid"]
    args = {"target": "main", "revision": revision}
    digest = action_digest("land", args)
    env = {
        "CORRAL_SESSION_BRANCH": "corral/lander",
        "CORRAL_GIT_REMOTE_URL": url,
    }
    leaf = {
        "identity": "x",
        "model": "claude-haiku-4-5",
        "tools": {"allow": ["mcp__corral__*"]},
        "landing": {"targets": ["main"], "check": {"name": "unit", "command": "make test"}},
    }
    with custodian(me, leaf, **env) as running:
        asked = call(running, "land", args)
        assert asked["isError"] is False and asked["endsTurn"] is True
        approval_name = json.loads(asked["content"])["approval"]
        approval = kubectl_json(control_plane, "get", "approval", approval_name, "-n", namespace)
        assert approval["spec"]["sessionRef"] == {"name": "lander", "uid": uid}
        assert approval["spec"]["action"]["digest"] == digest
        assert approval["metadata"]["ownerReferences"][0]["uid"] == uid

        pending = call(running, "land", args)
        assert pending["isError"] is True and "awaits" in pending["content"]
        # The harness's approval port polls the decision through the custodian.
        polled = httpx.get(
            f"{running.url}/approvals/{approval_name}", headers=running.headers, timeout=30
        )
        assert polled.json() == {"approval": approval_name, "decision": "Pending", "ready": True}
        # Without the pod-local credential, no one learns anything.
        assert httpx.get(f"{running.url}/approvals/{approval_name}").status_code == 401

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
        still = call(running, "land", args)
        assert still["isError"] is True and "awaits" in still["content"]
        stale_read = httpx.get(
            f"{running.url}/approvals/stale", headers=running.headers, timeout=30
        )
        assert stale_read.status_code == 404
        assert git(remote, "rev-parse", "main") != revision

        # A human approves the real one; the check has no Evidence yet, so land waits for it.
        patch_status(control_plane, "approval", approval_name, namespace, {"decision": "Approved"})
        decided = httpx.get(
            f"{running.url}/approvals/{approval_name}", headers=running.headers, timeout=30
        ).json()
        assert decided["decision"] == "Approved"
        no_evidence = call(running, "land", args)
        assert no_evidence["isError"] is True
        assert "waits for the Evidence of check 'unit'" in no_evidence["content"]

        # A Pass for another definition of the check (it ran `true`) does not count.
        apply(control_plane, evidence_doc(namespace, "unit-true", revision, url, "true", "true"))
        patch_status(
            control_plane, "evidence", "unit-true", namespace,
            {"verdict": "Pass", "finished": "2026-11-30T10:00:00Z"},
        )  # fmt: skip
        forged = call(running, "land", args)
        assert forged["isError"] is True and "does not exist yet" in forged["content"]
        assert git(remote, "rev-parse", "main") != revision

        ev = evidence_doc(namespace, "unit-pass", revision, url, "make test", "make test")
        apply(control_plane, ev)
        running_check = call(running, "land", args)
        assert "still running" in running_check["content"]
        patch_status(
            control_plane, "evidence", "unit-pass", namespace,
            {"verdict": "Pass", "finished": "2026-11-30T10:01:00Z"},
        )  # fmt: skip

        # The approval is for this revision only: another revision is a new question.
        other = call(running, "land", {"target": "main", "revision": "f" * 40})
        assert other["endsTurn"] is True and json.loads(other["content"])["approval"]

        # Only a revision the harness sent can land: the custodian never reads the workspace.
        unsent = call(running, "land", args)
        assert unsent["isError"] is True and "revision_not_sent" in unsent["content"], unsent
        assert send_head(running.url, running.headers, work, "conv") == revision
        landed = call(running, "land", args)
        assert landed["isError"] is False, landed
        assert git(remote, "rev-parse", "main") == revision


def test_the_agent_and_session_are_read_live_and_a_stranger_uid_is_refused(
    control_plane: ControlPlane, namespace: str, custodian: Start
) -> None:
    me = apply(control_plane, session("live", namespace))
    with custodian(me) as running:
        assert "spawn_child" in menu_names(running)
        # An edit of the Agent applies from the next call (the cache holds about a second).
        edited = {**ORCHESTRATOR, "tools": {"allow": ["mcp__corral__*"], "deny": ["*spawn*"]}}
        apply(control_plane, agent_doc(namespace, edited))
        time.sleep(1.2)
        assert "spawn_child" not in menu_names(running)
        refused = call(running, "spawn_child", {"task": "t"})
        assert "denied by the Agent's tools.deny" in refused["content"]

        # The model proxy follows the live Agent too: its model changes, the old one is refused.
        apply(control_plane, agent_doc(namespace, {**ORCHESTRATOR, "model": "claude-opus-4-1"}))
        time.sleep(1.2)
        answer = httpx.post(
            f"{running.url}/v1/messages", headers=running.headers, timeout=30,
            json={"model": "claude-haiku-4-5", "max_tokens": 5, "messages": []},
        )  # fmt: skip
        assert answer.status_code == 403 and "'claude-haiku-4-5' is not allowed" in answer.text

    # A Session of the same name but another uid (deleted and re-created) is not this one.
    impostor = {**me, "metadata": {**me["metadata"], "uid": "11111111-2222-3333-4444-555555555555"}}
    with custodian(impostor) as running:
        surface = httpx.get(
            f"{running.url}/agents/conv/surface", headers=running.headers, timeout=30
        )
        assert surface.status_code == 503 and "not this pod's" in surface.json()["reason"]
        answer = httpx.post(
            f"{running.url}/v1/messages", headers=running.headers, timeout=30,
            json={"model": "claude-haiku-4-5", "max_tokens": 5, "messages": []},
        )  # fmt: skip
        assert answer.status_code == 403 and "not this pod's" in answer.text
        assert call(running, "spawn_child", {"task": "t"})["isError"] is True


def test_children_run_under_listed_agents_only_and_carve_the_parents_budget(
    control_plane: ControlPlane, namespace: str, custodian: Start
) -> None:
    parent = apply(control_plane, session("carver", namespace))
    spec = {
        **ORCHESTRATOR,
        "limits": {**ORCHESTRATOR["limits"], "budget": {"tokens": 10000}},  # type: ignore[dict-item]
        "children": {"agents": ["reviewer"]},
    }
    with custodian(parent, spec, CORRAL_BUDGET_TOKENS="8000") as running:
        refused = call(running, "spawn_child", {"task": "t", "agent": "admin"})
        assert refused["isError"] is True and "spec.children.agents" in refused["content"]
        made = call(running, "spawn_child", {"task": "t", "agent": "reviewer"})
        assert made["isError"] is False, made
        child_name = json.loads(made["content"])["child"]
        child = kubectl_json(control_plane, "get", "session", child_name, "-n", namespace)
        assert child["spec"]["agentRef"] == "reviewer"
        # Half of the 8000 the Session's budget leaves (the lowest of Session and Agent).
        assert child["spec"]["budget"] == {"tokens": 4000}
        usage: Any = running.usage()
        assert usage["carved"]["input"] == 4000 and usage["budget"]["tokens"] == 8000
        asked = call(running, "spawn_child", {"task": "t", "budget": {"tokens": 99999}})
        second = json.loads(asked["content"])["child"]
        child = kubectl_json(control_plane, "get", "session", second, "-n", namespace)
        assert child["spec"]["budget"] == {"tokens": 4000}  # all that was left
    # The carve survives a restart: nothing is left to give.
    with custodian(parent, spec, CORRAL_BUDGET_TOKENS="8000") as running:
        patch_status(control_plane, "session", "carver", namespace, {"turns": 1})
        empty = call(running, "spawn_child", {"task": "t"})
        assert empty["isError"] is True and "no token budget left" in empty["content"]
        answer = httpx.post(
            f"{running.url}/v1/messages", headers=running.headers, timeout=30,
            json={"model": "claude-haiku-4-5", "max_tokens": 5, "messages": []},
        )  # fmt: skip
        assert answer.status_code == 429 and "8000 given to children" in answer.text
