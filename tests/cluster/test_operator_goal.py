"""Goals on the real API server: waves of Sessions run by the operator, each wave's revision
checked as Evidence in its own pod on the local node, Met or Failed (docs/goals.md)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.custodian._custodian_proc import git, git_daemon

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

# Outside /tmp, which the local node maps onto each pod's own /tmp volume.
_SERVED = Path.home() / ".cache" / "corral" / "test-repos"


@pytest.fixture
def remote() -> Iterator[tuple[Path, str]]:
    """A bare repository with one commit on main, served by `git daemon` on loopback (push
    enabled): its path and its git:// URL."""
    _SERVED.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="goal-", dir=_SERVED))
    seed = base / "seed"
    seed.mkdir()
    (seed / "price.txt").write_text("broken\n")
    git(seed, "init", "-q", "-b", "main")
    git(seed, "add", "-A")
    git(seed, "commit", "-qm", "the shop")
    git(base, "clone", "-q", "--bare", str(seed), str(base / "shop.git"))
    try:
        with git_daemon(base) as url:
            yield base / "shop.git", url + "shop.git"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _goal(name: str, repo: str, command: str, max_waves: int = 2) -> dict[str, Any]:
    template = {
        "agentRef": "coder",
        "task": "Write the word fixed into price.txt.",
        "workspace": {"repo": repo, "ref": "main"},
    }
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Goal",
        "metadata": {"name": name},
        "spec": {
            "description": "price.txt says fixed.",
            "success": {"name": "price", "command": command},
            "maxWaves": max_waves,
            "sessionTemplate": {"spec": template},
        },
    }


def _settled_goal(op: OperatorHandle, name: str, timeout: float) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = (op.get("goal", name) or {}).get("status") or {}
        return status if status.get("verdict") in ("Met", "Failed") else None

    try:
        return wait_for(f"goal {name} to settle", probe, timeout)
    except AssertionError as err:
        raise AssertionError(
            f"{err}\nstatus: {(op.get('goal', name) or {}).get('status')}\n"
            f"--- operator log (tail)\n{op.logs()[-4000:]}"
        ) from None


def test_a_goal_whose_waves_push_nothing_fails_after_max_waves(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-g0"
    wave1, wave2 = f"{name}-wave-1", f"{name}-wave-2"
    scripted_model.load(
        {
            "conversations": {
                wave1: [{"text": "I looked; price.txt needs a rewrite."}],
                wave2: [{"text": "Still nothing written."}],
            }
        }
    )
    operator.apply(agent_doc(), _goal(name, str(git_repo), "grep -qx fixed price.txt"))

    status = _settled_goal(operator, name, 180)
    assert status["verdict"] == "Failed", status
    assert status["waves"] == 2 and status["sessions"] == [wave1, wave2]
    assert [w["session"] for w in status["history"]] == [wave1, wave2]
    assert [w["verdict"] for w in status["history"]] == ["NoRevision", "NoRevision"]
    met = next(c for c in status["conditions"] if c["type"] == "Met")
    assert met["status"] == "False" and met["reason"] == "WavesExhausted"
    # Wave 2 was told what wave 1 came to.
    task = (operator.get("session", wave2) or {})["spec"]["task"]
    assert "wave 2 of at most 2" in task and "price.txt needs a rewrite" in task
    assert "pushed nothing to check" in task
    owner = (operator.get("session", wave1) or {})["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Goal" and owner["name"] == name
    table = operator.cp.kubectl("get", "goal", name, "-n", operator.namespace).stdout
    header = table.splitlines()[0].split()
    assert header[:5] == ["NAME", "WAVES", "MAX", "VERDICT", "SESSION"], header
    assert wave2 in table and "Failed" in table
    reasons = [e["reason"] for e in operator.events(name)]
    assert reasons.count("WaveStarted") == 2 and "GoalFailed" in reasons, reasons


def _writes(word: str, answer: str) -> list[dict[str, Any]]:
    command = f"echo {word} > price.txt"
    return [{"tool_use": {"name": "bash", "input": {"command": command}}}, {"text": answer}]


def test_a_goal_that_fails_its_check_in_wave_one_is_met_in_wave_two(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, remote: tuple[Path, str]
) -> None:
    bare, url = remote
    name = f"{operator.namespace}-g2"
    wave1, wave2 = f"{name}-wave-1", f"{name}-wave-2"
    scripted_model.load(
        {
            "conversations": {
                wave1: _writes("almost", "I wrote almost into price.txt."),
                wave2: _writes("fixed", "Now price.txt says fixed."),
            }
        }
    )
    operator.apply(agent_doc(), _goal(name, url, "grep -qx fixed price.txt", max_waves=3))

    status = _settled_goal(operator, name, 220)
    assert status["verdict"] == "Met", status
    assert status["waves"] == 2
    first, second = status["history"]
    assert (first["session"], first["verdict"]) == (wave1, "Fail"), first
    assert (second["session"], second["verdict"]) == (wave2, "Pass"), second
    rev1, rev2 = first["revision"], second["revision"]
    assert status["revision"] == rev2 and rev1 != rev2
    # Each revision is a real commit in the served remote; wave 2 built on wave 1's.
    assert git(bare, "show", f"{rev1}:price.txt") == "almost"
    assert git(bare, "show", f"{rev2}:price.txt") == "fixed"
    assert git(bare, "rev-parse", f"{rev2}~1") == rev1
    # The check ran as Evidence at each revision, in its own pod.
    for wave, verdict, exit_code in ((first, "Fail", 1), (second, "Pass", 0)):
        evidence = operator.get("evidence", wave["evidence"]) or {}
        assert evidence["spec"]["revision"] == wave["revision"]
        assert evidence["spec"]["command"] == "grep -qx fixed price.txt"
        assert evidence["status"]["verdict"] == verdict
        assert evidence["status"]["exitCode"] == exit_code
    # Wave 2 started from wave 1's revision, told what wave 1 answered and how its check came out.
    spec2 = (operator.get("session", wave2) or {})["spec"]
    assert spec2["workspace"]["ref"] == rev1
    assert "I wrote almost into price.txt." in spec2["task"]
    assert f"{rev1} was checked: Fail (exit code 1)" in spec2["task"]
    met = next(c for c in status["conditions"] if c["type"] == "Met")
    assert (met["status"], met["reason"]) == ("True", "GoalMet")
    assert operator.get("session", f"{name}-wave-3") is None
    reasons = [e["reason"] for e in operator.events(name)]
    for wanted in ("WaveStarted", "WaveChecking", "WaveFailed", "GoalMet"):
        assert wanted in reasons, reasons
