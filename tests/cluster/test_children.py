"""Children that report back, on the real API server: a three-level tree of Sessions, each in
its own sandbox, pushing to a real git server (`git daemon` on loopback). The parent waits
instead of finishing, resumes by its wait mode, and reads one line per child; each child starts
from its parent's working copy as it stood when it was spawned (docs/children.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.custodian._custodian_proc import git

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)
from .test_delivery import _bare_repo_of
from .test_delivery import served as served  # the git server fixture

pytestmark = pytest.mark.timeout(300)

ROOT, MID, LEAF = "tree", "tree-child-?????", "tree-child-?????-child-?????"


def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "bash", "input": {"command": command}}}


def _menu(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool_use": {"name": f"mcp__corral__{name}", "input": tool_input}}


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


def _last_user_text(request: dict[str, Any]) -> str:
    message = request["body"]["messages"][-1]
    assert message["role"] == "user"
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content if b.get("type") == "text")


def _children_of(op: OperatorHandle, uid: str) -> list[dict[str, Any]]:
    found = op.cp.kubectl(
        "get", "sessions", "-n", op.namespace, "-l", f"corral.dev/parent-uid={uid}", "-o", "json"
    )
    import json

    return list(json.loads(found.stdout)["items"])


def test_a_three_level_tree_waits_resumes_by_mode_and_reads_one_line_per_child(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, served: tuple[Path, str]
) -> None:
    base, url = served
    remote = base / "tree.git"
    source = base / "tree-src"
    source.mkdir()
    (source / "README.md").write_text("# tree\n")
    _bare_repo_of(source, remote)
    scripted_model.load(
        {
            "conversations": {
                ROOT: [
                    _bash("echo from-root > root.txt"),
                    _menu("spawn_child", task="Middle: build on the root's work."),
                    {"text": "Spawned the middle session."},
                    {"text": "All children are done."},
                ],
                MID: [
                    _bash("cat root.txt && echo from-mid > mid.txt"),
                    _menu("spawn_child", task="Leaf: finish it."),
                    _menu("wait_children", mode="first"),
                    {"text": "Middle done after the leaf."},
                ],
                LEAF: [
                    _bash("cat root.txt mid.txt && echo from-leaf > leaf.txt"),
                    {"text": "Leaf done: saw both files."},
                ],
            }
        }
    )
    tools = {"allow": ["bash", "mcp__corral__*"]}
    boss = agent_doc("boss", orchestrator=True, tools=tools, limits={"maxTurns": 4})
    doc = session_doc(ROOT, remote, agent="boss")
    doc["spec"]["workspace"]["repo"] = url + "tree.git"
    operator.apply(boss, doc)

    # The root's turn ends with its child running: it waits (mode all), it does not finish.
    waiting = operator.wait_phase(ROOT, {"WaitingForChildren", "Succeeded", "Failed"}, 150)
    assert waiting["phase"] == "WaitingForChildren", waiting
    assert waiting["waitingFor"]["mode"] == "all" and "finishedAt" not in waiting
    assert _condition(waiting, "Progressing")["reason"] == "WaitingForChildren"
    root_uid = operator.get("session", ROOT)["metadata"]["uid"]  # type: ignore[index]
    (mid,) = _children_of(operator, root_uid)
    mid_name = mid["metadata"]["name"]
    # The child starts from the root's working copy as it stood at the spawn.
    root_revision = waiting["delivery"]["revision"]
    assert mid["spec"]["workspace"]["ref"] == root_revision
    assert git(remote, "show", f"{root_revision}:root.txt") == "from-root"

    mid_waiting = operator.wait_phase(mid_name, {"WaitingForChildren", "Succeeded", "Failed"}, 150)
    assert mid_waiting["phase"] == "WaitingForChildren", mid_waiting
    assert mid_waiting["waitingFor"]["mode"] == "first"
    (leaf,) = _children_of(operator, mid["metadata"]["uid"])
    leaf_name = leaf["metadata"]["name"]
    assert leaf["spec"]["workspace"]["ref"] == mid_waiting["delivery"]["revision"]

    root = operator.wait_phase(ROOT, {"Succeeded", "Failed"}, 200)
    assert root["phase"] == "Succeeded", root
    statuses = {n: operator.session_status(n) for n in (mid_name, leaf_name)}
    assert statuses[mid_name]["phase"] == statuses[leaf_name]["phase"] == "Succeeded"
    leaf_status = statuses[leaf_name]

    # The leaf saw both ancestors' work; its own is on its branch.
    leaf_requests = scripted_model.requests(leaf_name)
    leaf_seen = str(leaf_requests[1]["body"]["messages"])
    assert "from-root" in leaf_seen and "from-mid" in leaf_seen
    leaf_revision = leaf_status["delivery"]["revision"]
    assert git(remote, "rev-parse", f"refs/heads/corral/{leaf_name}") == leaf_revision
    assert git(remote, "show", f"{leaf_revision}:leaf.txt") == "from-leaf"

    # One line per child, sewn into the parent's next turn: name, outcome, answer, branch, sha.
    mid_resume = _last_user_text(scripted_model.requests(mid_name)[-1])
    assert (
        f"- child {leaf_name}: Succeeded: Leaf done: saw both files. "
        f"(pushed corral/{leaf_name} at {leaf_revision})"
    ) in mid_resume
    assert "wait mode: first" in mid_resume
    root_resume = _last_user_text(scripted_model.requests(ROOT)[-1])
    mid_revision = statuses[mid_name]["delivery"]["revision"]
    assert root_resume.count("- child ") == 1
    assert f"- child {mid_name}: Succeeded: Middle done after the leaf." in root_resume
    assert f"at {mid_revision})" in root_resume
    assert root["reportedChildren"] == [mid_name]
    assert root["turns"] == 2 and statuses[mid_name]["turns"] == 2
    # Every sandbox went with its session.
    for name in (ROOT, mid_name, leaf_name):
        try:
            wait_for(
                f"{name}'s pod to go", lambda n=name: operator.get("pod", f"corral-{n}") is None
            )
        except AssertionError:
            print(operator.session_status(name))
            print(operator.logs()[-6000:])
            raise
