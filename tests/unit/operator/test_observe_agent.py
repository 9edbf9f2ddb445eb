"""A pass that may make the Session's pod reads the Agent from the API server, not from the
watch: `kubectl apply agent; kubectl patch agent ...; kubectl apply session` in quick succession
can reach the operator's Session watch before its Agent watch has seen the patch, and a pod
made from the older Agent keeps the older credentials for its whole life."""

from __future__ import annotations

import asyncio
from typing import Any

from corral_operator.runtime import Runtime
from corral_operator.session.context import LoopContext
from corral_operator.session.observe import observe
from corral_operator.settings import OperatorSettings

WITHOUT_KEY = {"metadata": {"name": "fixer"}, "spec": {"model": "m"}}
WITH_KEY = {"metadata": {"name": "fixer"},
            "spec": {"model": "m", "credentials": {"modelSecretRef": {"name": "key"}}}}  # fmt: skip


class ApiServerStandIn:
    """Answers GETs as the API server would after the patch (a stand-in for one, named so);
    the watch cache in the runtime still holds the Agent from before it."""

    def __init__(self, session: dict[str, Any], pod: dict[str, Any] | None) -> None:
        self.objects = {"sessions/s": session, "agents/fixer": WITH_KEY, "pods/corral-s": pod}
        self.gets: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.gets.append(path)
        return next((body for tail, body in self.objects.items() if path.endswith(tail)), None)

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return []


def _session(phase: str | None) -> dict[str, Any]:
    status = {"phase": phase, "conditions": [{"type": "Ready"}]} if phase else {}
    return {"metadata": {"name": "s", "namespace": "ns", "uid": "u"},
            "spec": {"agentRef": "fixer"}, "status": status}  # fmt: skip


def _observe(session: dict[str, Any], pod: dict[str, Any] | None) -> dict[str, Any] | None:
    kube = ApiServerStandIn(session, pod)
    runtime = Runtime(kube=kube, settings=OperatorSettings())  # type: ignore[arg-type]
    runtime.agents.saw("ns", "fixer", WITHOUT_KEY)  # what the Agent watch delivered so far
    runtime.pods.saw("ns", "corral-s", pod)

    async def run() -> dict[str, Any] | None:
        ctx = LoopContext(runtime, "ns", "s", session)
        observed = await observe(ctx)
        assert observed is not None
        return observed.agent

    return asyncio.run(run())


def test_a_pass_without_a_pod_reads_the_agent_as_the_api_server_has_it() -> None:
    assert _observe(_session(None), None) == WITH_KEY
    assert _observe(_session("Pending"), None) == WITH_KEY


def test_a_pass_with_a_pod_reads_the_watched_agent() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "corral-s"}}
    assert _observe(_session("Running"), pod) == WITHOUT_KEY
