"""The reads a Session's pass makes without a GET: its own view of the Session, the Freezes of
its namespace, the pods whose changes wake it, and the copies kopf's storages make."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import kopf
import pytest

from corral_operator import runtime
from corral_operator.kopfext.diffbase import LeanAnnotationsProgressStorage, json_copy
from corral_operator.runtime import FreezeCache, WatchedObjects, pod_essentials
from corral_operator.session.view import SessionView

PATH = "/apis/corral.dev/v1alpha1/namespaces/ns/sessions/s1"


def _session(version: str, phase: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {
            "name": "s1",
            "namespace": "ns",
            "resourceVersion": version,
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"agentRef": "coder", "task": "t"},
        "status": {"phase": phase},
    }


class ApiServer:
    """The API server as the view sees it: GETs counted, status patches applied."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.gets = 0
        self.version = int(body["metadata"]["resourceVersion"])
        self.freeze_lists = 0
        self.freezes: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        assert path == PATH
        self.gets += 1
        return copy.deepcopy(self.body)

    async def patch_status(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.write(patch)
        return copy.deepcopy(self.body)

    def write(self, status: dict[str, Any]) -> str:
        """Anyone's write: a new resourceVersion."""
        self.version += 1
        self.body["status"].update(status)
        self.body["metadata"]["resourceVersion"] = str(self.version)
        return str(self.version)

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        assert path.endswith("/namespaces/ns/freezes")
        self.freeze_lists += 1
        return copy.deepcopy(self.freezes)


def test_the_first_pass_reads_the_watched_body_and_managed_fields_are_dropped() -> None:
    server = ApiServer(_session("10"))
    live = _session("10")
    view = SessionView(cast(Any, server), PATH, live)
    body = asyncio.run(view.read())
    assert body is not None and body["status"]["phase"] == "Pending"
    assert server.gets == 0
    assert "managedFields" not in body["metadata"]
    body["status"]["phase"] = "changed by a planner"  # the caller's copy
    assert asyncio.run(view.read())["status"]["phase"] == "Pending"  # type: ignore[index]


def test_the_views_own_write_is_newer_than_a_lagging_watch() -> None:
    server = ApiServer(_session("10"))
    live = _session("10")
    view = SessionView(cast(Any, server), PATH, live)

    async def scenario() -> None:
        await view.read()
        await view.patch_status({"phase": "Running"})
        await view.patch_status({"phase": "Succeeded"})
        # The watch has delivered neither write yet: the view's own answer is the newest.
        body = await view.read()
        assert body is not None and body["status"]["phase"] == "Succeeded"
        live["metadata"]["resourceVersion"] = "11"  # the first write arrives
        body = await view.read()
        assert body is not None and body["status"]["phase"] == "Succeeded"

    asyncio.run(scenario())
    assert server.gets == 0


def test_someone_elses_write_is_read_from_the_server() -> None:
    server = ApiServer(_session("10"))
    live = _session("10")
    view = SessionView(cast(Any, server), PATH, live)

    async def scenario() -> None:
        await view.read()
        # Someone else writes, then the view writes on top; the watch shows only theirs.
        theirs = server.write({"question": "from a person"})
        await view.patch_status({"phase": "Running"})
        live["metadata"]["resourceVersion"] = theirs
        live["status"] = {"phase": "Pending", "question": "from a person"}
        body = await view.read()
        # Neither the lagging watch body (no Running) nor a guess: the server's.
        assert body is not None and body["status"]["phase"] == "Running"
        assert body["status"]["question"] == "from a person"

    asyncio.run(scenario())
    assert server.gets == 1


def test_a_write_that_leaves_the_status_alone_is_taken_from_the_watch() -> None:
    server = ApiServer(_session("10"))
    live = _session("10")
    view = SessionView(cast(Any, server), PATH, live)

    async def scenario() -> None:
        await view.read()
        await view.patch_status({"phase": "Running"})  # version 11, the view's own
        # kopf adds its finalizer on top (version 12): the live body carries the view's
        # status and a version the view never saw.
        live["metadata"].update(resourceVersion="12", finalizers=["corral.dev/finalizer"])
        live["status"] = {"phase": "Running"}
        body = await view.read()
        assert body is not None and body["metadata"]["finalizers"] == ["corral.dev/finalizer"]
        assert body["status"]["phase"] == "Running"
        # The same version again is the view's own now: still no GET.
        assert (await view.read()) == body

    asyncio.run(scenario())
    assert server.gets == 0


def test_a_watch_behind_the_views_own_write_after_someone_elses_is_not_read_again() -> None:
    server = ApiServer(_session("10"))
    live = _session("10")
    view = SessionView(cast(Any, server), PATH, live)

    async def scenario() -> None:
        await view.read()
        # kopf adds its finalizer (version 11) just before the view's write (version 12).
        server.body["metadata"]["finalizers"] = ["corral.dev/finalizer"]
        finalizer = server.write({})
        await view.patch_status({"phase": "Running"})
        # The watch delivers kopf's write only: the status the view wrote over.
        live["metadata"].update(resourceVersion=finalizer, finalizers=["corral.dev/finalizer"])
        body = await view.read()
        assert body is not None and body["status"]["phase"] == "Running"
        assert body["metadata"]["finalizers"] == ["corral.dev/finalizer"]
        # Someone else then writes a status the view never knew: read from the server.
        live["metadata"]["resourceVersion"] = server.write({"question": "from a person"})
        live["status"] = {"phase": "Running", "question": "from a person"}
        body = await view.read()
        assert body is not None and body["status"]["question"] == "from a person"

    asyncio.run(scenario())
    assert server.gets == 1  # only for the status the view never knew


def test_a_freeze_list_is_read_once_then_kept_by_watch_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("corral_operator.runtime.time.monotonic", lambda: clock[0])
    server = ApiServer(_session("1"))
    server.freezes = [{"metadata": {"name": "all"}, "spec": {"frozen": True}}]
    cache = FreezeCache()
    cache.saw(
        "ns", "early", {"metadata": {"name": "early"}}
    )  # before the first list: its list sees it

    async def reads(n: int) -> list[list[dict[str, Any]]]:
        return list(
            await asyncio.gather(*(cache.freezes(cast(Any, server), "ns") for _ in range(n)))
        )

    first = asyncio.run(reads(50))
    assert server.freeze_lists == 1  # fifty passes at once: one LIST
    assert all([f["metadata"]["name"] for f in got] == ["all"] for got in first)
    cache.saw("ns", "team", {"metadata": {"name": "team"}, "spec": {"frozen": True}})
    cache.saw("ns", "all", None)
    names = [f["metadata"]["name"] for f in asyncio.run(reads(1))[0]]
    assert names == ["team"] and server.freeze_lists == 1
    clock[0] += runtime.FREEZE_RELIST_SECONDS + 1  # a lost DELETED lasts at most this long
    server.freezes = []
    assert asyncio.run(reads(1)) == [[]] and server.freeze_lists == 2


def test_only_a_change_a_pass_reads_wakes_the_session() -> None:
    seen = WatchedObjects(keep=pod_essentials)
    pod: dict[str, Any] = {"metadata": {"name": "p", "uid": "u"}, "spec": {}, "status": {}}
    assert seen.saw("ns", "p", pod) is True
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = "node-1"  # a binding: nothing a pass reads
    assert seen.saw("ns", "p", bound) is False
    ready = copy.deepcopy(bound)
    ready["status"] = {"podIP": "127.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}
    assert seen.saw("ns", "p", ready) is True
    assert seen.saw("ns", "p", None) is True  # gone
    assert seen.saw("ns", "p", None) is False  # gone already


def test_the_progress_storage_clears_as_kopfs_own() -> None:
    essence = cast(
        kopf.BodyEssence,
        {
            "spec": {"task": "t", "limits": [1, {"a": None}]},
            "metadata": {"annotations": {"corral.dev/fix": '{"retries": 1}', "note": "kept"}},
        },
    )
    stock = kopf.AnnotationsProgressStorage(prefix="corral.dev").clear(essence=essence)
    lean = LeanAnnotationsProgressStorage(prefix="corral.dev").clear(essence=essence)
    assert lean == stock and lean["metadata"]["annotations"] == {"note": "kept"}
    assert "corral.dev/fix" in essence["metadata"]["annotations"]  # a copy: the input stays


def test_json_copy_is_deep() -> None:
    tree = {"a": [{"b": 1}], "c": "x"}
    copied = json_copy(tree)
    copied["a"][0]["b"] = 2
    assert tree == {"a": [{"b": 1}], "c": "x"}
