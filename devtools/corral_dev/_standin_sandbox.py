"""STAND-IN SANDBOX for the many-Session benchmarks and tests: many sandbox pods, one process.

A real sandbox pod is three processes (harness, tools, custodian); 1,000 of them do not fit on
two cores (docs/performance.md, part A). This stand-in takes the place of the kubelet and of
every pod's containers at once, and says so in its name, its log and the benchmark's output.
What it does:

- watches the namespace's sandbox pods (the labels the operator puts on them) and marks each
  one Running and Ready on an address of its own (127.A.B.1, away from the local node's
  127.0.X.Y), through `pods/status`, as a kubelet would;
- listens on that address at the harness's port (the wire: admit, updates with long-poll,
  history, abort, end, readyz) and at the custodian's operator port (`GET /v1/usage`,
  `GET /v1/delivery`), with the request and answer shapes of `corral_api.wire`;
- accepts only the pod's own wire token, read from the Secret the pod mounts, as the harness
  and the custodian do; anything else is a 401 with an `ErrorBody`;
- runs each admitted submission as a turn that settles `completed` after `--turn-seconds`, and
  records its usage, which the usage endpoint then reports as the custodian would;
- answers an admission that repeats a conversation's idempotencyKey with the submission that
  key was first given, admitting nothing, as the harness does (an operator that lost its ledger
  write, or a leader killed before it, asks again with the same key);
- with `--record FILE`, appends one JSON line to FILE for every admission its wire answered
  with a submission (`t`, `pod`, `conversation`, `submission`, `key`: the idempotencyKey,
  `turn`, and `repeat`: true for a repeated key answered with its first submission): the
  sandbox's own account of what was admitted, whoever asked (bench/takeover_bench.py and
  tests/cluster/test_operator_burst_takeover.py compare it with the Sessions').

What it does not do: run a model, tools or a checkout. The operator's side is unchanged: it
creates real objects, reads real pod status and speaks the real wire over TCP.

Run: `python -m corral_dev._standin_sandbox --kubeconfig K --namespace NS [--turn-seconds S]
[--record FILE]` (prints `ready`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import logging
import re
import secrets
import ssl
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
from aiohttp import web
from pydantic import ValidationError

from corral_api.wire import (
    AbortRequest,
    AbortResponse,
    AdmitRequest,
    AdmitResponse,
    CustodianDelivery,
    CustodianUsage,
    EndRequest,
    EndResponse,
    ErrorBody,
    SettledEvent,
    UpdatesResponse,
    WireUsage,
)

log = logging.getLogger("corral.standin")

HARNESS_PORT = 8080
CUSTODIAN_OPERATOR_PORT = 8082
SANDBOX_SELECTOR = (
    "app.kubernetes.io/managed-by=corral-operator,app.kubernetes.io/component=sandbox"
)
WIRE_VOLUME = "wire"
NODE_NAME = "corral-standin-sandbox"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")  # the harness's rule for names
MAX_WAIT_SECONDS = 60.0
# What one stand-in turn spends: the usage record reports it, as the custodian's would.
TURN_USAGE = WireUsage(input=120, output=8, cost=0.0)


def _error(status: int, error: str, reason: str) -> web.Response:
    body = ErrorBody(error=error, reason=reason).model_dump(exclude_none=True)
    return web.json_response(body, status=status)


@dataclass
class Conversation:
    events: list[dict[str, Any]] = field(default_factory=list)
    grew: asyncio.Event = field(default_factory=asyncio.Event)
    queue: list[str] = field(default_factory=list)  # unsettled submissions, admission order
    turns: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    by_key: dict[str, AdmitResponse] = field(default_factory=dict)  # by idempotencyKey
    ended: bool = False

    def emit(self, type_: str, submission_id: str, **fields: Any) -> None:
        self.events.append(
            {
                "offset": len(self.events),
                "type": type_,
                "submissionId": submission_id,
                "ts": round(time.time(), 6),
                **fields,
            }
        )
        self.grew.set()
        self.grew = asyncio.Event()

    def settle(self, submission_id: str, status: str, **fields: Any) -> None:
        if submission_id not in self.queue:
            return
        self.queue.remove(submission_id)
        event = {"offset": len(self.events), "submissionId": submission_id, "status": status}
        SettledEvent.model_validate({**event, **fields})  # the wire's own shape, or a bug here
        self.emit("settled", submission_id, status=status, **fields)


@dataclass
class StandinPod:
    name: str
    ip: str
    token: str
    sites: list[web.TCPSite] = field(default_factory=list)
    conversations: dict[tuple[str, str], Conversation] = field(default_factory=dict)
    usage: WireUsage = field(default_factory=WireUsage)


class StandinSandbox:
    def __init__(
        self,
        api: httpx.AsyncClient,
        namespace: str,
        turn_seconds: float,
        record: TextIO | None = None,
    ) -> None:
        self._api = api
        self._ns = namespace
        self._turn_seconds = turn_seconds
        self._record = record  # --record: one JSON line per admission answered
        self._pods: dict[str, StandinPod] = {}  # by pod name
        self._by_ip: dict[str, StandinPod] = {}
        self._addresses = (f"127.{200 + i // 250}.{i % 250 + 1}.1" for i in itertools.count())
        self.harness = web.AppRunner(self._harness_app(), access_log=None)
        self.custodian = web.AppRunner(self._custodian_app(), access_log=None)
        self.bound = 0
        self._starting: set[str] = set()
        self._released: set[str] = set()  # pods it has deleted (as a kubelet, once)
        self._tasks: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------------------ pod side

    async def watch_pods(self) -> None:
        path = f"/api/v1/namespaces/{self._ns}/pods"
        while True:
            listed = (await self._api.get(path, params={"labelSelector": SANDBOX_SELECTOR})).json()
            for pod in listed.get("items") or []:
                await self._on_pod("ADDED", pod)
            params = {
                "watch": "1",
                "labelSelector": SANDBOX_SELECTOR,
                "resourceVersion": listed["metadata"]["resourceVersion"],
                "allowWatchBookmarks": "false",
            }
            try:
                async with self._api.stream("GET", path, params=params, timeout=None) as resp:
                    async for line in resp.aiter_lines():
                        if line:
                            event = json.loads(line)
                            if event.get("type") == "ERROR":
                                break  # too old a resourceVersion: list again
                            await self._on_pod(event["type"], event["object"])
            except httpx.HTTPError as err:
                log.warning("pod watch ended: %r; listing again", err)
                await asyncio.sleep(0.5)

    async def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        """Take each pod as a node would, each in a task of its own: one slow API call must
        not hold up the pods behind it."""
        meta = pod["metadata"]
        name = meta["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            deleted = kind == "DELETED"
            if deleted:
                self._released.discard(name)
            elif name in self._released:
                return  # a later update of a pod it has deleted already
            if name in self._starting or name in self._pods or node == NODE_NAME:
                self._starting.discard(name)
                if not deleted:
                    self._released.add(name)
                self._spawn(self._stop_pod(name, pod, deleted))
            return
        if name in self._starting or name in self._pods or node not in (None, NODE_NAME):
            return
        if (pod.get("status") or {}).get("podIP"):
            return  # an earlier run of the stand-in served it: not this one's
        self._starting.add(name)
        self._spawn(self._start_pod(pod))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        try:
            if not pod["spec"].get("nodeName") and not await self._bind(pod):
                return
            token = await self._wire_token(pod)
            if token is None or name not in self._starting:
                return
            ip = next(self._addresses)
            standin = StandinPod(name, ip, token)
            for runner, port in (
                (self.harness, HARNESS_PORT),
                (self.custodian, CUSTODIAN_OPERATOR_PORT),
            ):
                site = web.TCPSite(runner, ip, port, reuse_address=True)
                await site.start()
                standin.sites.append(site)
            self._pods[name] = standin
            self._by_ip[ip] = standin
            await self._mark_ready(name, ip)
            self.bound += 1
        except httpx.HTTPError as err:
            log.warning("pod %s: not started: %r", name, err)
        finally:
            self._starting.discard(name)

    async def _bind(self, pod: dict[str, Any]) -> bool:
        """Bind the pod to the stand-in's node, as a scheduler would; False when another node
        took it first (a local node on the same cluster)."""
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
        }
        answer = await self._api.post(
            f"/api/v1/namespaces/{self._ns}/pods/{meta['name']}/binding", json=binding
        )
        return answer.status_code < 300

    async def _stop_pod(self, name: str, pod: dict[str, Any], deleted: bool) -> None:
        """Stop serving the pod; then, as its kubelet, let the API server remove the object."""
        gone = self._pods.pop(name, None)
        if gone is not None:
            self._by_ip.pop(gone.ip, None)
            for conv in gone.conversations.values():
                for task in conv.turns.values():
                    task.cancel()
            for site in gone.sites:
                await site.stop()
        if not deleted:
            with contextlib.suppress(httpx.HTTPError):
                await self._api.request(
                    "DELETE",
                    f"/api/v1/namespaces/{self._ns}/pods/{name}",
                    json={
                        "gracePeriodSeconds": 0,
                        "preconditions": {"uid": pod["metadata"]["uid"]},
                    },
                )

    async def register_node(self) -> None:
        """The Node the pods are bound to: without it the pod garbage collector deletes them."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"corral.dev/stand-in": "true"}},
        }
        answer = await self._api.post("/api/v1/nodes", json=node)
        if answer.status_code not in (201, 409):
            raise RuntimeError(f"the stand-in's Node was refused: {answer.text[:300]}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "StandIn",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
            "message": "STAND-IN SANDBOX, not a kubelet",
        }
        await self._api.patch(
            f"/api/v1/nodes/{NODE_NAME}/status",
            json={"status": {"conditions": [ready]}},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    async def _wire_token(self, pod: dict[str, Any]) -> str | None:
        """The token the pod's harness would read from its wire Secret."""
        for volume in pod["spec"].get("volumes") or []:
            if volume.get("name") == WIRE_VOLUME and volume.get("secret"):
                secret_name = volume["secret"]["secretName"]
                found = await self._api.get(f"/api/v1/namespaces/{self._ns}/secrets/{secret_name}")
                if found.status_code != 200:
                    log.warning(
                        "pod %s: its wire Secret %s is not readable",
                        pod["metadata"]["name"],
                        secret_name,
                    )
                    return None
                return base64.b64decode(found.json()["data"]["token"]).decode()
        log.warning("pod %s mounts no wire Secret; not a sandbox pod", pod["metadata"]["name"])
        return None

    async def _mark_ready(self, name: str, ip: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
        }
        answer = await self._api.patch(
            f"/api/v1/namespaces/{self._ns}/pods/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if answer.status_code >= 400:
            log.warning("pod %s: status not written: %s", name, answer.text[:300])

    # ---------------------------------------------------------------------- wire side

    def _pod_for(self, request: web.Request) -> StandinPod | web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        pod = self._by_ip.get(sockname[0]) if sockname else None
        if pod is None:
            return _error(503, "bad_request", "no sandbox pod at this address (yet)")
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
        if not given or not secrets.compare_digest(given, pod.token):
            return _error(401, "unauthorized", "no or wrong wire token")
        return pod

    def _harness_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self._readyz)
        app.router.add_post("/agents/{agent}/{conversation}", self._admit)
        app.router.add_get("/agents/{agent}/{conversation}/updates", self._updates)
        app.router.add_get("/agents/{agent}/{conversation}/history", self._history)
        app.router.add_post("/agents/{agent}/{conversation}/abort", self._abort)
        app.router.add_post("/agents/{agent}/{conversation}/end", self._end)
        return app

    def _custodian_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/v1/usage", self._usage)
        app.router.add_get("/v1/delivery", self._delivery)
        return app

    async def _readyz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    @staticmethod
    def _names(request: web.Request) -> tuple[str, str] | web.Response:
        agent, conversation = request.match_info["agent"], request.match_info["conversation"]
        for label, value in (("agent", agent), ("conversation", conversation)):
            if not NAME.match(value):
                return _error(400, "bad_name", f"{label} name {value!r} must match {NAME.pattern}")
        return agent, conversation

    async def _admit(self, request: web.Request) -> web.Response:
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        names = self._names(request)
        if isinstance(names, web.Response):
            return names
        try:
            body = AdmitRequest.model_validate(json.loads(await request.read() or b"null"))
        except (ValueError, ValidationError) as exc:
            return _error(400, "bad_request", str(exc)[:500])
        conv = pod.conversations.get(names)
        if body.kept and conv is None:
            answer = ErrorBody(
                error="unknown_conversation", reason="kept: no such conversation", kept=False
            )
            return web.json_response(answer.model_dump(exclude_none=True), status=404)
        conv = conv or pod.conversations.setdefault(names, Conversation())
        again = conv.by_key.get(body.idempotencyKey) if body.idempotencyKey else None
        if again is not None:
            # The caller lost the first answer (its ledger write): the same submission, as the
            # harness answers.
            self._write_record(pod, names[1], again.submissionId, body, repeat=True)
            return web.json_response(again.model_dump())
        submission = f"sub-{secrets.token_hex(8)}"
        offset = len(conv.events)
        conv.queue.append(submission)
        conv.turns[submission] = asyncio.ensure_future(self._turn(pod, conv, submission))
        stream = f"/agents/{names[0]}/{names[1]}/updates"
        admitted = AdmitResponse(streamUrl=stream, offset=offset, submissionId=submission)
        if body.idempotencyKey:
            conv.by_key[body.idempotencyKey] = admitted
        self._write_record(pod, names[1], submission, body, repeat=False)
        return web.json_response(admitted.model_dump())

    def _write_record(
        self,
        pod: StandinPod,
        conversation: str,
        submission: str,
        body: AdmitRequest,
        *,
        repeat: bool,
    ) -> None:
        """One line of the --record file: this admission, as its wire answered it."""
        if self._record is None:
            return
        line = {
            "t": time.time(),
            "pod": pod.name,
            "conversation": conversation,
            "submission": submission,
            "key": body.idempotencyKey,
            "turn": body.turn,
            "repeat": repeat,
        }
        self._record.write(json.dumps(line) + "\n")

    async def _turn(self, pod: StandinPod, conv: Conversation, submission: str) -> None:
        while conv.queue and conv.queue[0] != submission:  # one at a time, admission order
            await conv.grew.wait()
        conv.emit("submission_started", submission)
        await asyncio.sleep(self._turn_seconds)
        pod.usage = pod.usage + TURN_USAGE
        usage = TURN_USAGE.model_dump()
        conv.settle(submission, "completed", usage=usage, text="Done.")
        conv.turns.pop(submission, None)

    async def _updates(self, request: web.Request) -> web.Response:
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        names = self._names(request)
        if isinstance(names, web.Response):
            return names
        conv = pod.conversations.get(names)
        if conv is None:
            return _error(404, "unknown_conversation", f"no conversation {names[0]}/{names[1]}")
        try:
            offset = int(request.query.get("offset", "0"))
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return _error(400, "bad_request", "offset and wait must be numbers")
        if offset < 0 or wait < 0:
            return _error(400, "bad_request", "offset and wait must not be negative")
        if len(conv.events) <= offset and wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(conv.grew.wait(), min(wait, MAX_WAIT_SECONDS))
        events = conv.events[offset:]
        page = UpdatesResponse(events=events, offset=offset + len(events))
        return web.json_response(page.model_dump())

    async def _history(self, request: web.Request) -> web.Response:
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        names = self._names(request)
        if isinstance(names, web.Response):
            return names
        conv = pod.conversations.get(names)
        if conv is None:
            return _error(404, "unknown_conversation", f"no conversation {names[0]}/{names[1]}")
        return web.json_response(
            UpdatesResponse(events=conv.events, offset=len(conv.events)).model_dump()
        )

    async def _abort(self, request: web.Request) -> web.Response:
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        names = self._names(request)
        if isinstance(names, web.Response):
            return names
        conv = pod.conversations.get(names)
        if conv is None or not conv.queue:
            return web.json_response(AbortResponse(aborted=False).model_dump())
        try:
            sweep = AbortRequest.model_validate(json.loads(await request.read() or b"{}"))
        except ValueError:
            sweep = AbortRequest()
        active, *queued = list(conv.queue)
        ended = sweep.cause == "pick" and sweep.submissionId == active
        for submission in (active, *queued):
            task = conv.turns.pop(submission, None)
            if task is not None:
                task.cancel()
            if submission == active and ended:
                conv.settle(submission, "ended", text="")
            else:
                error = {"type": "submission_aborted", "message": "swept by an abort"}
                conv.settle(submission, "aborted", error=error, text="")
        return web.json_response(AbortResponse(aborted=True).model_dump())

    async def _end(self, request: web.Request) -> web.Response:
        """The session is over: the stand-in has no sessionEnd hooks to run."""
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        names = self._names(request)
        if isinstance(names, web.Response):
            return names
        try:
            EndRequest.model_validate(json.loads(await request.read() or b"{}"))
        except (ValueError, ValidationError) as exc:
            return _error(400, "bad_request", str(exc)[:500])
        conv = pod.conversations.get(names)
        if conv is None or conv.ended:  # unknown or already ended: the harness's answer
            return web.json_response(EndResponse(ended=False).model_dump(exclude_none=True))
        conv.ended = True  # its history stays readable, as the harness keeps it
        return web.json_response(EndResponse(ended=True).model_dump(exclude_none=True))

    async def _delivery(self, request: web.Request) -> web.Response:
        """No tools ran, so nothing was delivered: the record a custodian gives before its
        first delivery."""
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        return web.json_response(CustodianDelivery().model_dump())

    async def _usage(self, request: web.Request) -> web.Response:
        pod = self._pod_for(request)
        if isinstance(pod, web.Response):
            return pod
        return web.json_response(CustodianUsage(usage=pod.usage).model_dump())


def api_client(kubeconfig: Path) -> httpx.AsyncClient:
    """An admin client for the API server, from a client-certificate kubeconfig."""
    cfg = json.loads(kubeconfig.read_text())
    cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    tls.load_cert_chain(user["client-certificate"], user["client-key"])
    limits = httpx.Limits(max_connections=API_CONCURRENCY + 4, max_keepalive_connections=None)
    transport = _OneAtATimeBeyond(httpx.AsyncHTTPTransport(verify=tls, limits=limits))
    return httpx.AsyncClient(base_url=cluster["server"], transport=transport, timeout=30)


# At most this many API calls in flight (a watch is not counted). 1,000 pods starting at once
# queued hundreds of calls in httpx's pool, which matches each queued call against every
# connection on every change: that scan was most of the stand-in's CPU (docs/performance.md),
# and keep-alive limits below the concurrency made it open a TLS connection per call.
API_CONCURRENCY = 32


class _OneAtATimeBeyond(httpx.AsyncBaseTransport):
    """A transport that admits API_CONCURRENCY calls at a time; the rest wait here, cheaply."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self._slots = asyncio.Semaphore(API_CONCURRENCY)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch"):
            return await self._inner.handle_async_request(request)
        async with self._slots:
            response = await self._inner.handle_async_request(request)
            await response.aread()  # the slot is the whole call, body included
            return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def serve(
    kubeconfig: Path, namespace: str, turn_seconds: float, record: TextIO | None = None
) -> None:
    async with api_client(kubeconfig) as api:
        standin = StandinSandbox(api, namespace, turn_seconds, record)
        await standin.harness.setup()
        await standin.custodian.setup()
        await standin.register_node()
        print("ready", flush=True)
        try:
            await standin.watch_pods()
        finally:
            await standin.harness.cleanup()
            await standin.custodian.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="STAND-IN SANDBOX: many sandbox pods, one process")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--turn-seconds", type=float, default=0.5)
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="FILE",
        help="append a JSON line to FILE for every admission answered with a submission",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s standin %(message)s")
    log.info("STAND-IN SANDBOX for namespace %s: not a kubelet, not a harness", args.namespace)
    with contextlib.ExitStack() as stack:
        # Line-buffered: each admission is in the file once answered, for a reader meanwhile
        # and after a SIGTERM or SIGKILL.
        record = stack.enter_context(args.record.open("a", buffering=1)) if args.record else None
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.kubeconfig, args.namespace, args.turn_seconds, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
