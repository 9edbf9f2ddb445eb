"""The custodian's spending record: usage and what was given to children, kept in memory and
on disk (so a restarted custodian keeps the budget spent), and the reservations of requests in
flight (in memory only: they end with the process that holds them).

Every method is synchronous, so on the event loop a check and the reservation it allows happen
with no other request in between.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

from .budget import CallUsage, Held, UsageTotals, held_by


class UsageStore:
    def __init__(
        self,
        state_dir: Path | None,
        seed: UsageTotals | None = None,
        carved_seed: Held | None = None,
    ) -> None:
        self._dir = state_dir
        # A resumed Session's new pod starts from what the lost one had spent; its own record
        # on disk (a restarted custodian in the same pod) already includes that.
        self.totals = dataclasses.replace(seed) if seed is not None else UsageTotals()
        self.carved = carved_seed if carved_seed is not None else Held()
        self._reservations: dict[int, CallUsage] = {}
        self._ids = itertools.count(1)
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
            totals_file = state_dir / "usage.json"
            if totals_file.exists():
                self.totals = UsageTotals.from_json(totals_file.read_text())
            carved_file = state_dir / "carved.json"
            if carved_file.exists():
                data = json.loads(carved_file.read_text())
                self.carved = Held(int(data.get("tokens", 0)), float(data.get("cost", 0.0)))

    # ---------------------------------------------------------------------- reservations

    @property
    def reserved(self) -> Held:
        total = Held()
        for call in self._reservations.values():
            total = total + held_by(call)
        return total

    def reserved_usage(self) -> CallUsage:
        summed = CallUsage(model="")
        for call in self._reservations.values():
            summed.input += call.input
            summed.output += call.output
        return summed

    def reserve(self, call: CallUsage) -> int:
        ticket = next(self._ids)
        self._reservations[ticket] = call
        return ticket

    def settle(self, ticket: int, actual: CallUsage | None) -> None:
        """Release a reservation and record what the request really used (None: nothing)."""
        if self._reservations.pop(ticket, None) is None:
            return  # settled already
        if actual is not None:
            self.record(actual)

    # ---------------------------------------------------------------------------- records

    def record(self, call: CallUsage) -> None:
        self.totals.add(call)
        if self._dir is None:
            return
        line = {
            "at": time.time(),
            "model": call.model,
            "input": call.input,
            "output": call.output,
            "cacheRead": call.cache_read,
            "cacheWrite": call.cache_write,
            "cost": call.cost(),
        }
        self._append(line)
        self._replace("usage.json", self.totals.to_json())

    def carve(self, amount: Held, child: str) -> None:
        """Count `amount` as given to a child, from now on and across restarts."""
        self.carved = self.carved + amount
        if self._dir is None:
            return
        self._append({"at": time.time(), "carved": {"tokens": amount.tokens,
                      "cost": amount.cost}, "child": child})  # fmt: skip
        self._replace(
            "carved.json", json.dumps({"tokens": self.carved.tokens, "cost": self.carved.cost})
        )

    def _append(self, line: dict[str, Any]) -> None:
        assert self._dir is not None
        with (self._dir / "usage.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")

    def _replace(self, name: str, text: str) -> None:
        # Write-then-rename, so a crash never leaves half a file.
        assert self._dir is not None
        tmp = self._dir / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self._dir / name)
