"""The egress gateway's decisions, as each Session's status and Events tell them (docs/egress.md).

Each gateway replica keeps its own records (a connection reaches one replica through the
Service). The operator reads every replica's `/v1/egress` on its admin port each
POLL_SECONDS, merges the answers per Session and keeps them here; each Session's loop writes
its share into `status.egress` with its own writes (the gateway has no right to write a
Session), and the poll posts a Warning Event at the first denial of each destination. A read
that fails keeps the last merged records: a replica that restarts loses its own counts, and
the status keeps what it last showed of them until fresher counts arrive.

A warm pod's adoption asks the replicas one more thing: whether each knows the pod's new
binding yet (`await_binding`), since the pod must not act on a binding a replica has not seen.

Pure functions first (merge, summary, the denials not yet told); the poll last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from corral_api.kinds import EGRESS_STATUS_HOSTS

from . import naming
from .kube import Kube, collection_path
from .planning.session import PlannedEvent
from .settings import EgressGateway

log = logging.getLogger("corral.operator.egress")

POLL_SECONDS = 10.0
READ_TIMEOUT = 5.0
SessionKey = tuple[str, str]  # (namespace, Session name)
_HostKey = tuple[str, str, int, str]  # (identity, host, port, decision)


# --------------------------------------------------------------------------- pure parts


def merge_replicas(answers: Iterable[Mapping[str, Any]]) -> dict[SessionKey, list[dict[str, Any]]]:
    """Every replica's records summed per Session and destination: counts and bytes add up,
    the first and last times are the earliest and latest. Evidence pods (no Session) are
    left out: they have no status to show them in."""
    merged: dict[SessionKey, dict[_HostKey, dict[str, Any]]] = {}
    for answer in answers:
        for record in answer.get("sessions") or []:
            session = str(record.get("session") or "")
            if not session:
                continue
            hosts = merged.setdefault((str(record.get("namespace") or ""), session), {})
            for host in record.get("hosts") or []:
                key = (
                    str(host.get("identity")),
                    str(host.get("host")),
                    int(host.get("port") or 0),
                    str(host.get("decision")),
                )
                _add(hosts, key, host)
    return {k: list(v.values()) for k, v in merged.items()}


def _add(hosts: dict[_HostKey, dict[str, Any]], key: _HostKey, host: Mapping[str, Any]) -> None:
    seen = hosts.get(key)
    if seen is None:
        identity, name, port, decision = key
        hosts[key] = {
            "host": name,
            "port": port,
            "identity": identity,
            "decision": decision,
            "reason": host.get("reason") or None,
            "count": int(host.get("count") or 0),
            "bytesUp": int(host.get("bytesUp") or 0),
            "bytesDown": int(host.get("bytesDown") or 0),
            "firstSeen": host.get("firstSeen"),
            "lastSeen": host.get("lastSeen"),
        }
        return
    for counter in ("count", "bytesUp", "bytesDown"):
        seen[counter] += int(host.get(counter) or 0)
    seen["firstSeen"] = _earliest(seen.get("firstSeen"), host.get("firstSeen"))
    later = _latest(seen.get("lastSeen"), host.get("lastSeen"))
    if later != seen.get("lastSeen"):
        seen["reason"] = host.get("reason") or seen.get("reason")
    seen["lastSeen"] = later


def _earliest(a: str | None, b: str | None) -> str | None:
    times = [t for t in (a, b) if t]
    return min(times, key=_instant) if times else None


def _latest(a: str | None, b: str | None) -> str | None:
    times = [t for t in (a, b) if t]
    return max(times, key=_instant) if times else None


def _instant(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)


def summary(hosts: list[dict[str, Any]], observed_at: str) -> dict[str, Any]:
    """`status.egress`: the totals, and the destinations denied first, then the busiest, at
    most EGRESS_STATUS_HOSTS of them (the rest counted)."""
    ordered = sorted(
        hosts,
        key=lambda h: (h["decision"] != "denied", -int(h["count"]), h["host"], h["port"]),
    )
    listed = [{k: v for k, v in h.items() if v is not None} for h in ordered]
    return {
        "allowed": sum(int(h["count"]) for h in hosts if h["decision"] == "allowed"),
        "denied": sum(int(h["count"]) for h in hosts if h["decision"] == "denied"),
        "hosts": listed[:EGRESS_STATUS_HOSTS],
        "moreHosts": max(0, len(listed) - EGRESS_STATUS_HOSTS),
        "observedAt": observed_at,
    }


def with_egress(status: dict[str, Any], egress: dict[str, Any] | None) -> dict[str, Any]:
    """The status a Session's loop writes, with the gateway's latest summary when there is
    one; the same status when the counts did not change (so no write for the time alone)."""
    if egress is None:
        return status
    before = status.get("egress") or {}
    if {k: v for k, v in before.items() if k != "observedAt"} == {
        k: v for k, v in egress.items() if k != "observedAt"
    }:
        return status
    return {**status, "egress": egress}


def denial_events(
    hosts: list[dict[str, Any]], told: set[_HostKey], since: str | None
) -> list[PlannedEvent]:
    """A Warning for each denied destination not told yet (`told` is updated), unless its
    first denial is not after `since` (what the Session's status already showed when this
    operator started: no second Event after a restart)."""
    events: list[PlannedEvent] = []
    for host in hosts:
        if host["decision"] != "denied":
            continue
        key = (host["identity"], host["host"], int(host["port"]), "denied")
        if key in told:
            continue
        told.add(key)
        first = host.get("firstSeen")
        if since and first and _instant(first) <= _instant(since):
            continue
        who = "The agent's" if host["identity"] == "agent" else "The custodian's"
        why = host.get("reason") or "not allowed"
        events.append(
            PlannedEvent(
                "Warning",
                "EgressDenied",
                f"{who} connection to {host['host']}:{host['port']} was refused: {why}",
            )
        )
    return events


# ------------------------------------------------------------------------------ the poll


@dataclass
class _Watched:
    """A Session the poll tells of: how to name it in an Event, and what its status showed."""

    ref: dict[str, Any]
    since: str | None
    told: set[_HostKey] = field(default_factory=set)


@dataclass
class EgressRecords:
    """The merged records of every gateway replica, by Session."""

    hosts: dict[SessionKey, list[dict[str, Any]]] = field(default_factory=dict)
    observed_at: str | None = None
    _watched: dict[SessionKey, _Watched] = field(default_factory=dict)

    def summary_for(self, namespace: str, name: str) -> dict[str, Any] | None:
        hosts = self.hosts.get((namespace, name))
        if hosts is None or self.observed_at is None:
            return None
        return summary(hosts, self.observed_at)

    def watch(self, body: Mapping[str, Any]) -> None:
        """Called by each Session's loop: the poll may tell this Session's denials."""
        md = body.get("metadata") or {}
        key = (str(md.get("namespace")), str(md.get("name")))
        if key in self._watched:
            return
        ref = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {k: md.get(k) for k in ("name", "namespace", "uid")},
        }
        shown = ((body.get("status") or {}).get("egress") or {}).get("observedAt")
        self._watched[key] = _Watched(ref, shown)

    def forget(self, namespace: str, name: str) -> None:
        self._watched.pop((namespace, name), None)

    def update(
        self, merged: dict[SessionKey, list[dict[str, Any]]], observed_at: str
    ) -> tuple[list[SessionKey], list[tuple[dict[str, Any], PlannedEvent]]]:
        """Take a poll's merge: the Sessions whose records changed, and the Events to post."""
        changed = [k for k, v in merged.items() if self.hosts.get(k) != v]
        # A Session no replica mentions any more keeps its last records while its loop runs
        # (a replica restarted); any other is dropped, so the records stay bounded by what the
        # gateways keep and the Sessions this operator runs.
        kept = {k: v for k, v in self.hosts.items() if k in self._watched}
        self.hosts = {**kept, **merged}
        self.observed_at = observed_at
        events: list[tuple[dict[str, Any], PlannedEvent]] = []
        for key in changed:
            watched = self._watched.get(key)
            if watched is None:
                continue
            for event in denial_events(merged[key], watched.told, watched.since):
                events.append((watched.ref, event))
        return changed, events


def _admin_port(pod: Mapping[str, Any], gateway: EgressGateway) -> int:
    """The pod's container port named `admin`, else the port the Service names."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "admin" and port.get("containerPort"):
                return int(port["containerPort"])
    return gateway.admin_port


async def running_replicas(
    kube: Kube, gateway: EgressGateway, *, serving: bool = False
) -> list[dict[str, Any]]:
    """The gateway's Running pods that have an address; with `serving`, only those the Service
    sends connections to (Ready, not being deleted)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(gateway.pod_labels.items()))
    pods = await kube.list(collection_path("v1", "Pod", gateway.namespace), label_selector=selector)
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
        and p["status"].get("podIP")
        and (not serving or _serving(p))
    ]


def _serving(pod: Mapping[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = pod["status"].get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _admin_url(pod: Mapping[str, Any], gateway: EgressGateway, path: str) -> str:
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{_admin_port(pod, gateway)}{path}"


async def read_replicas(
    kube: Kube, gateway: EgressGateway, client: httpx.AsyncClient
) -> list[dict[str, Any]]:
    """Every Running replica's records; a replica that does not answer is left out."""

    async def one(pod: dict[str, Any]) -> dict[str, Any] | None:
        try:
            url = _admin_url(pod, gateway, "/v1/egress")
            answer = await client.get(url, params={"detail": "hosts"})
            answer.raise_for_status()
            body = answer.json()
        except (httpx.HTTPError, ValueError) as err:
            log.warning("egress gateway %s: records not read: %s", pod["metadata"]["name"], err)
            return None
        return body if isinstance(body, dict) else None

    answers = await asyncio.gather(*(one(p) for p in await running_replicas(kube, gateway)))
    return [a for a in answers if a is not None]


BINDING_WAIT_SECONDS = 15.0
_BINDING_POLL_SECONDS = 0.05


async def await_binding(
    kube: Kube,
    gateway: EgressGateway,
    pod_ip: str,
    uid: str,
    digest: str,
    *,
    timeout: float = BINDING_WAIT_SECONDS,
) -> str | None:
    """Wait until every serving replica (Ready, not being deleted: the ones the Service sends
    connections to) maps `pod_ip` to the pod `uid` under the binding whose annotation text has
    SHA-256 `digest`; None once they all do, else why not (no replica serves, or one still has
    another binding when `timeout` ends)."""
    deadline = asyncio.get_running_loop().time() + timeout
    pending: str | None = "no replica of the egress gateway is ready"
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(READ_TIMEOUT, connect=2.0), trust_env=False
    ) as client:
        while True:
            replicas = await running_replicas(kube, gateway, serving=True)
            waiting = [
                p for p in replicas if not await _knows(client, gateway, p, pod_ip, uid, digest)
            ]
            if replicas and not waiting:
                return None
            if waiting:
                names = ", ".join(sorted(str(p["metadata"]["name"]) for p in waiting))
                pending = f"the egress gateway's replicas {names} do not know the pod's binding yet"
            if asyncio.get_running_loop().time() >= deadline:
                return f"{pending} after {timeout:g} s"
            await asyncio.sleep(_BINDING_POLL_SECONDS)


async def _knows(
    client: httpx.AsyncClient,
    gateway: EgressGateway,
    replica: Mapping[str, Any],
    pod_ip: str,
    uid: str,
    digest: str,
) -> bool:
    try:
        answer = await client.get(
            _admin_url(replica, gateway, "/v1/bindings"), params={"ip": pod_ip}
        )
        body = answer.json() if answer.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(body, dict) and body.get("uid") == uid and body.get("digest") == digest


def event_manifest(ref: Mapping[str, Any], event: PlannedEvent, now: str) -> dict[str, Any]:
    """A core/v1 Event on the Session `ref` names. The poll is no kopf handler, so it writes
    the Event itself (kopf's queue serves only its handlers' tasks)."""
    md = ref["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
        "involvedObject": {
            "apiVersion": ref.get("apiVersion"),
            "kind": ref.get("kind"),
            "name": md["name"],
            "namespace": md["namespace"],
            "uid": md.get("uid"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": "corral-operator"},
        "reportingComponent": "corral-operator",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def poll_forever(
    kube: Kube,
    gateway: EgressGateway,
    records: EgressRecords,
    wake: Any,
    interval: float = POLL_SECONDS,
) -> None:
    """Read, merge and keep the gateway's records; wake each Session whose records changed
    (`wake(namespace, session_label)`) and post the new denials' Events."""
    async with httpx.AsyncClient(timeout=READ_TIMEOUT, trust_env=False) as client:
        while True:
            try:
                answers = await read_replicas(kube, gateway, client)
                if answers:
                    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    changed, events = records.update(merge_replicas(answers), now)
                    for ref, event in events:
                        try:
                            await kube.create(event_manifest(ref, event, now))
                        except Exception as err:  # an Event is best effort; the rest goes on
                            log.warning("egress Event not posted: %s", err)
                    for namespace, name in changed:
                        wake(namespace, naming.label_value(name))
            except Exception as err:  # the poll must outlive any one failure
                log.warning("egress gateway records not read: %s", err)
            await asyncio.sleep(interval)
