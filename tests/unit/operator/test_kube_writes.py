"""The operator's API adapter holds updates and deletes to a few in flight, never creates or
reads (ADR 0091): a new Session's Secret and pod do not queue behind other Sessions' writes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from corral_operator.kube import WRITES_IN_FLIGHT, Kube
from corral_operator.metrics import OperatorMetrics


class StalledApi:
    """A Kubernetes client whose calls wait until released, counting how many are in flight."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.release = asyncio.Event()

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.in_flight[method] = self.in_flight.get(method, 0) + 1
        await self.release.wait()
        return {}


def _kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return str(path)


@pytest.mark.parametrize("slots", [WRITES_IN_FLIGHT, 2])
async def test_updates_and_deletes_wait_for_a_slot_while_creates_and_reads_go_at_once(
    tmp_path: Path, slots: int
) -> None:
    connected = await Kube.connect(_kubeconfig(tmp_path), writes_in_flight=slots)
    await connected.close()
    api = StalledApi()
    kube = dataclasses.replace(connected, client=api)  # the connected adapter's slots, stalled
    path = "/api/v1/namespaces/ns/pods/p"
    many = slots * 3
    calls = [
        *(kube.request("PATCH", f"{path}/status", body={}) for _ in range(many)),
        *(kube.request("DELETE", path) for _ in range(many)),
        *(kube.request("POST", "/api/v1/namespaces/ns/secrets", body={}) for _ in range(many)),
        *(kube.request("GET", path) for _ in range(many)),
    ]
    tasks = [asyncio.ensure_future(call) for call in calls]
    for _ in range(5):
        await asyncio.sleep(0)
    held = api.in_flight.get("PATCH", 0) + api.in_flight.get("DELETE", 0)
    assert held == slots
    assert kube.write_slots() == (2 * many - slots, slots)  # what the metrics export
    assert api.in_flight["POST"] == many and api.in_flight["GET"] == many
    api.release.set()
    await asyncio.gather(*tasks)
    assert api.in_flight["PATCH"] == many and api.in_flight["DELETE"] == many  # all served
    assert kube.write_slots() == (0, 0)


async def test_a_write_cancelled_while_it_waits_gives_up_its_place() -> None:
    api = StalledApi()
    kube = Kube(api, asyncio.Semaphore(1))  # type: ignore[arg-type]
    first = asyncio.ensure_future(kube.request("DELETE", "/api/v1/namespaces/ns/pods/a"))
    second = asyncio.ensure_future(kube.request("DELETE", "/api/v1/namespaces/ns/pods/b"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert kube.write_slots() == (1, 1)
    second.cancel()
    await asyncio.sleep(0)
    assert kube.write_slots() == (0, 1)
    api.release.set()
    await first
    assert kube.write_slots() == (0, 0) and not kube.writes.locked()


def test_the_write_slots_are_exported() -> None:
    metrics = OperatorMetrics()
    metrics.write_slots = lambda: (7, 6)
    samples = {
        sample.name: sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name.startswith("corral_api_writes")
    }
    assert samples == {"corral_api_writes_waiting": 7, "corral_api_writes_in_flight": 6}
