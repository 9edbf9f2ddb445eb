"""Agent and Session objects as the API server would hand them to the operator."""

from __future__ import annotations

from typing import Any

from corral_api.kinds import Agent, Session


def agent(name: str = "coder", **spec: Any) -> Agent:
    body: dict[str, Any] = {"identity": "You write code.", "model": "claude-test"}
    body.update(spec)
    return Agent.model_validate(
        {"metadata": {"name": name, "namespace": "team-a", "uid": "agent-uid"}, "spec": body}
    )


def session(name: str = "fix-bug", agent_ref: str = "coder", **spec: Any) -> Session:
    body: dict[str, Any] = {
        "agentRef": agent_ref,
        "task": "Fix the bug.",
        "workspace": {"repo": "https://git.example/repo.git", "ref": "main"},
    }
    body.update(spec)
    return Session.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "team-a",
                "uid": "0d9c7d5e-1111-2222-3333-444455556666",
                "generation": 1,
            },
            "spec": body,
        }
    )
