"""What a Session's pass reads from the operator's watches instead of the API server: recent
bodies only, forgotten on deletion; and when it lists the Session's children at all."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from corral_operator import runtime
from corral_operator.planning.children import may_have_children
from corral_operator.runtime import WatchedObjects


def test_a_watched_body_stands_in_for_a_get_until_it_is_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: clock[0])
    seen = WatchedObjects()
    pod = {"metadata": {"name": "corral-s1"}, "status": {"podIP": "127.0.0.9"}}
    seen.saw("ns", "corral-s1", pod)
    assert seen.get("ns", "corral-s1") is pod
    assert seen.get("other", "corral-s1") is None  # namespaces never mix
    clock[0] += runtime.WATCHED_FRESH_SECONDS + 0.1
    assert seen.get("ns", "corral-s1") is None  # too old: the caller asks the API server


def test_a_deletion_forgets_the_object() -> None:
    seen = WatchedObjects()
    seen.saw("ns", "coder", {"metadata": {"name": "coder"}})
    seen.saw("ns", "coder", None)
    assert seen.get("ns", "coder") is None
    seen.saw("ns", "never-seen", None)  # forgetting the unknown is no error
    assert seen.get("ns", "never-seen") is None


def _agent(orchestrator: bool) -> dict[str, Any]:
    return {"metadata": {"name": "a"}, "spec": {"identity": "x", "orchestrator": orchestrator}}


@pytest.mark.parametrize(
    ("status", "agent", "lists"),
    [
        ({}, _agent(False), False),  # a plain Session: no LIST per pass
        ({}, _agent(True), True),  # an orchestrator may have started children
        ({}, None, True),  # its Agent is unknown: do not guess
        ({"phase": "WaitingForChildren"}, _agent(False), True),
        ({"children": {"total": 2, "running": 1}}, _agent(False), True),
        ({"children": {"total": 0}}, _agent(False), False),
    ],
)
def test_only_a_session_that_can_have_children_lists_them(
    status: dict[str, Any], agent: dict[str, Any] | None, lists: bool
) -> None:
    body = {"metadata": {"name": "s", "uid": "u"}, "spec": {}, "status": status}
    assert may_have_children(body, agent) is lists


async def _http_server(host: str) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = host.encode()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, host, 0)


def test_each_sandbox_address_gets_its_own_pool_and_idle_pools_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [5000.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: clock[0])

    async def scenario() -> None:
        servers = [await _http_server(h) for h in ("127.0.0.1", "127.0.0.2", "127.0.0.3")]
        urls = [
            f"http://{s.sockets[0].getsockname()[0]}:{s.sockets[0].getsockname()[1]}"
            for s in servers
        ]
        shared = runtime.SharedTransport()
        for url in urls[:2]:
            for _ in range(3):
                async with httpx.AsyncClient(base_url=url, transport=shared) as client:
                    assert (await client.get("/")).text == url.split("//")[1].split(":")[0]
        assert len(shared._pools) == 2  # one per address, kept across clients
        clock[0] += runtime.IDLE_POOL_SECONDS + 1
        async with httpx.AsyncClient(transport=shared) as client:
            assert (await client.get(urls[2])).text == "127.0.0.3"
        assert len(shared._pools) == 1  # a new address swept the two idle pools away
        await shared.close_pool()
        assert shared._pools == {}
        for server in servers:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_pod_is_kept_as_what_a_pass_reads_of_it() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "corral-s1",
            "uid": "p1",
            "labels": {"corral.dev/session": "s1"},
            "ownerReferences": [{"kind": "Session", "uid": "u", "controller": True}],
            "deletionTimestamp": "2026-11-30T00:00:00Z",
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"containers": [{"name": "harness", "env": [{"name": "X", "value": "y"}]}]},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.9",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "harness", "ready": True}],
        },
    }
    seen = WatchedObjects(keep=runtime.pod_essentials)
    seen.saw("ns", "corral-s1", pod)
    kept = seen.get("ns", "corral-s1")
    assert kept == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: pod["metadata"][k] for k in
                     ("name", "uid", "labels", "ownerReferences", "deletionTimestamp")},
        "status": {k: pod["status"][k] for k in ("phase", "podIP", "conditions")},
    }  # fmt: skip
