"""What wakes a Session's loop: its driver's end at once (not at its 30 s safety net), and
not the ADDED event of the pod its own pass created."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from corral_operator.runtime import Runtime
from corral_operator.session.drive import DRIVER_RECHECK, watch_driver
from corral_operator.session.loop import SessionLoop
from corral_operator.session.sandbox import create_ours
from corral_operator.settings import OperatorSettings


class Running:
    """kopf's stop flag, not set: the daemon keeps running."""

    def __bool__(self) -> bool:
        return False


def test_a_finished_driver_is_noticed_before_the_recheck() -> None:
    async def scenario() -> float:
        rt = Runtime(kube=cast(Any, None), settings=OperatorSettings())
        loop = SessionLoop(rt, "ns", "s1")
        driver = asyncio.create_task(asyncio.sleep(0.05))  # a turn that settles at once
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(
            watch_driver(loop.ctx, driver, cast(Any, None), Running(), {}), DRIVER_RECHECK / 3
        )
        return asyncio.get_running_loop().time() - started

    # Waiting for the driver *and* a wake-up returned only at the 30 s recheck: the pod of
    # every finished Session stayed that long, and a freeze interrupted a turn that late.
    assert asyncio.run(scenario()) < 2.0


class CreatingApi:
    """The API server's answer to a create: the object as stored (uid, phase Pending)."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] = {}

    async def create_object(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        self.stored = {
            **manifest,
            "metadata": {**manifest["metadata"], "uid": "pod-uid", "resourceVersion": "7"},
            "status": {"phase": "Pending", "qosClass": "Guaranteed"},
        }
        return dict(self.stored)


def test_the_pod_a_pass_created_does_not_wake_the_next_pass() -> None:
    api = CreatingApi()
    rt = Runtime(kube=cast(Any, api), settings=OperatorSettings())
    loop = SessionLoop(rt, "ns", "s1")
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "corral-s1", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"containers": []},
    }
    assert asyncio.run(create_ours(loop.ctx, manifest, "session-uid", remember=True))
    # The pod's ADDED event carries what the create answered: nothing a pass reads changed.
    assert rt.pods.saw("ns", "corral-s1", dict(api.stored)) is False
    # Its binding changes nothing either; the kubelet's address and readiness do.
    bound = {**api.stored, "spec": {"nodeName": "n1", "containers": []}}
    assert rt.pods.saw("ns", "corral-s1", bound) is False
    ready = {**bound, "status": {"phase": "Running", "podIP": "198.18.0.5"}}
    assert rt.pods.saw("ns", "corral-s1", ready) is True
