"""Leader election on a coordination.k8s.io Lease: one operator of several drives Sessions
(ADR 0103, docs/operations.md "Two operators").

The rules are client-go's, so a mixed fleet of controllers reads one Lease the same way:

- a standby takes the Lease when it is missing, released (no holder), or unchanged for a
  whole `duration` by *this process's* clock (the record's own renewTime is never compared
  with the local clock: nodes' clocks may differ);
- the leader renews every `retry_period` and, when no renewal has succeeded for
  `renew_deadline` (shorter than `duration`), stops leading before any standby may take over:
  the process exits (the Deployment restarts it as a standby), since a kopf operator cannot
  be made to drop its handlers mid-flight;
- a leader stopped on purpose releases the Lease, so its standby takes over at its next try.

With the defaults (15 s, 10 s, 2 s) a standby takes over a SIGKILLed leader within
`duration + 2 * retry_period` (19 s) of its last renewal: it sees the renewal up to one try
later, counts the duration from there, and takes the Lease at the first try past it. A
released Lease is taken within `retry_period` (2 s).

`decide` is the pure part; `LeaseElector` holds the Lease through corral_kube, on a client
of its own (never behind the operator's write slots: a burst of status writes must not
starve the renewal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from corral_kube import Conflict, KubeClient, KubeError, NotFound

log = logging.getLogger("corral.leadership")

LEASE_API = "/apis/coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseTerms:
    """How long a Lease holds, how long a leader keeps trying to renew it, how often."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period}, {self.renew_deadline}, {self.duration})"
            )

    @property
    def takeover_bound(self) -> float:
        """The longest a standby waits after a leader's last renewal before it leads: the
        renewal is seen up to one try late, and the Lease taken at the first try past it."""
        return self.duration + 2 * self.retry_period


@dataclass(frozen=True)
class Seen:
    """A Lease's record as this process last saw it change, and when (its monotonic clock)."""

    holder: str
    renewed: str
    duration: float
    at: float


Move = Literal["create", "take", "wait"]


def decide(
    spec: dict[str, Any] | None, me: str, seen: Seen | None, now: float
) -> tuple[Move, Seen]:
    """What a process that wants the Lease does now, and the record as it now stands.

    `spec` is the Lease's spec (None: no Lease yet); `now` is this process's monotonic clock.
    """
    if spec is None:
        return "create", Seen("", "", 0.0, now)
    record = (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        float(spec.get("leaseDurationSeconds") or 0),
    )
    if seen is None or (seen.holder, seen.renewed, seen.duration) != record:
        seen = Seen(*record, at=now)  # it changed: its holder is alive as of now
    holder, _, duration = record
    if not holder or holder == me or now >= seen.at + duration:
        return "take", seen
    return "wait", seen


def micro_time(at: datetime | None = None) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LostLeadership(Exception):
    """The Lease was taken by another, or could not be renewed within the renew deadline."""


class LeaseElector:
    """Acquire, hold and release one Lease as `identity`."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        terms: LeaseTerms = LeaseTerms(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.identity, self.terms, self._clock = identity, terms, clock
        self.holder = ""  # the holder as last seen (for the standby's readiness answer)
        self._seen: Seen | None = None

    @property
    def path(self) -> str:
        return f"{LEASE_API}/namespaces/{self.namespace}/leases/{self.name}"

    async def acquire(self) -> float:
        """Wait until this process holds the Lease; the seconds it waited."""
        started = self._clock()
        while not await self.try_acquire():
            await asyncio.sleep(self.terms.retry_period)
        return self._clock() - started

    async def try_acquire(self) -> bool:
        """One try: True when this process holds the Lease now."""
        try:
            lease = await self.client.get(self.path)
        except KubeError as e:
            log.warning("leader election: reading lease %s failed: %s", self.path, e)
            return False
        move, self._seen = decide(
            None if lease is None else lease.get("spec") or {},
            self.identity,
            self._seen,
            self._clock(),
        )
        self.holder = self._seen.holder
        if move == "wait":
            return False
        try:
            if move == "create":
                await self._create()
            else:
                assert lease is not None
                await self._write(lease, taking=True)
        except (Conflict, NotFound):
            return False  # another process wrote it first: look again at the next try
        except KubeError as e:
            log.warning("leader election: writing lease %s failed: %s", self.path, e)
            return False
        self.holder = self.identity
        log.info("leader election: %s leads (lease %s)", self.identity, self.path)
        return True

    async def hold(self, on_lost: Callable[[str], Awaitable[None] | None]) -> None:
        """Renew the Lease until cancelled; `on_lost(why)` when it can no longer be held."""
        last = self._clock()
        while True:
            await asyncio.sleep(self.terms.retry_period)
            try:
                await self.renew()
                last = self._clock()
            except LostLeadership as e:
                return await _call(on_lost, str(e))
            except KubeError as e:
                if self._clock() - last >= self.terms.renew_deadline:
                    why = f"no renewal for {self.terms.renew_deadline:g} s (last error: {e})"
                    return await _call(on_lost, why)
                log.warning("leader election: renewing lease %s failed: %s", self.path, e)

    async def renew(self) -> None:
        """Write a fresh renewTime on the Lease this process holds."""
        current = await self.client.get(self.path)
        holder = str(((current or {}).get("spec") or {}).get("holderIdentity") or "")
        if current is None or holder != self.identity:
            raise LostLeadership(f"the lease is held by {holder or 'nobody'} now")
        try:
            await self._write(current, taking=False)
        except Conflict as e:
            raise LostLeadership(f"the lease changed under this leader: {e}") from e

    async def release(self) -> None:
        """Let the standby take over at once (a leader stopped on purpose)."""
        try:
            current = await self.client.get(self.path)
            spec = (current or {}).get("spec") or {}
            if current is None or spec.get("holderIdentity") != self.identity:
                return
            released = {**current, "spec": {**spec, "holderIdentity": None, "renewTime": None}}
            released["spec"]["leaseDurationSeconds"] = 1
            await self.client.request("PUT", self.path, body=released)
            log.info("leader election: %s released lease %s", self.identity, self.path)
        except KubeError as e:
            log.warning("leader election: releasing lease %s failed: %s", self.path, e)

    async def _create(self) -> None:
        now = micro_time()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.terms.duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        await self.client.request(
            "POST", f"{LEASE_API}/namespaces/{self.namespace}/leases", body=body, answer=False
        )

    async def _write(self, lease: dict[str, Any], *, taking: bool) -> None:
        """PUT with the read resourceVersion: a concurrent writer makes this a Conflict."""
        spec = dict(lease.get("spec") or {})
        now = micro_time()
        if taking and spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.terms.duration),
            renewTime=now,
        )
        await self.client.request("PUT", self.path, body={**lease, "spec": spec}, answer=False)


async def _call(callback: Callable[[str], Awaitable[None] | None], why: str) -> None:
    done = callback(why)
    if done is not None:
        await done


def parse_lease(text: str) -> tuple[str, str]:
    """NAMESPACE/NAME, checked."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{text!r} is not NAMESPACE/NAME (e.g. corral-system/corral-operator)")
    return namespace, name
