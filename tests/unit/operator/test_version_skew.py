"""A sandbox whose harness speaks a wire version this operator cannot drive (docs/operations.md,
"Upgrade"): nothing of it is read. With an archive the pod is drained (marked, then deleted), so
the planner resumes the Session in a new pod and its Resumed condition names the cause; without
one the Session is held."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from corral_operator.archive.store import FileArchive
from corral_operator.driver import WireVersionUnsupported
from corral_operator.naming import ANNOTATION_DRAINED
from corral_operator.planning import reasons as R
from corral_operator.planning.session import plan_session
from corral_operator.runtime import Runtime
from corral_operator.session.context import LoopContext
from corral_operator.session.loop import RETRY_AFTER_ERROR, SKEWED_RECHECK, drain_skewed
from corral_operator.settings import OperatorSettings
from tests._objects import agent_body, sandbox_pod, session_body

from .test_session_planner import ARCHIVING, NOW

SKEW = WireVersionUnsupported("the harness speaks wire version 2.0 and this operator 1.1")


class ApiServerStandIn:
    """What the drain calls: read the pod and the Session, patch and delete the pod (a
    stand-in for the API server, named so; the drain's effect on a real one is the deletion)."""

    def __init__(self, session: dict[str, Any], pod: dict[str, Any]) -> None:
        self.session, self.pod = session, pod
        self.calls: list[tuple[str, str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.pod if "/pods/" in path else self.session

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, path, body))
        return {}

    async def delete(self, path: str, **_: Any) -> bool:
        self.calls.append(("DELETE", path, None))
        return True


def _drain(archive: Path | None) -> tuple[float, list[tuple[str, str, Any]]]:
    session = session_body(status={"phase": "Running", "podName": "corral-fix-bug", "turns": 1})
    kube = ApiServerStandIn(session, sandbox_pod(True))
    settings = OperatorSettings(archive_dir=str(archive)) if archive else OperatorSettings()
    runtime = Runtime(kube=kube, settings=settings)  # type: ignore[arg-type]
    if archive is not None:
        runtime.archive = FileArchive(archive)

    async def run() -> float:
        ctx = LoopContext(runtime, session["metadata"]["namespace"], "fix-bug", session)
        return await drain_skewed(ctx, SKEW)

    return asyncio.run(run()), kube.calls


def test_with_an_archive_the_pod_is_marked_then_deleted(tmp_path: Path) -> None:
    again, calls = _drain(tmp_path)
    assert again == RETRY_AFTER_ERROR
    (patch, path, body), (delete, deleted, _) = calls
    assert (patch, delete) == ("PATCH", "DELETE") and path == deleted
    assert path.endswith("/pods/corral-fix-bug")
    assert body == {"metadata": {"annotations": {ANNOTATION_DRAINED: R.VERSION_SKEW}}}


def test_without_an_archive_the_session_is_held_and_its_pod_kept() -> None:
    again, calls = _drain(None)
    assert (again, calls) == (SKEWED_RECHECK, [])


def test_the_drained_pod_resumes_the_session_naming_the_cause() -> None:
    pod = sandbox_pod(False, deleting=True)
    pod["metadata"]["annotations"] = {ANNOTATION_DRAINED: R.VERSION_SKEW}
    status = {"phase": "Running", "podName": "corral-fix-bug", "turns": 1}
    plan = plan_session(session_body(status=status), agent_body(), pod, ARCHIVING, NOW)
    resumed = next(c for c in plan.status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == R.VERSION_SKEW and "wire version" in resumed["message"]
    assert plan.status["restarts"] == 1
