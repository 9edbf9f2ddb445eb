"""Usage totals kept in memory and on disk, so a restarted custodian keeps the budget spent."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .budget import CallUsage, UsageTotals


class UsageStore:
    def __init__(self, state_dir: Path | None) -> None:
        self._dir = state_dir
        self.totals = UsageTotals()
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
            totals_file = state_dir / "usage.json"
            if totals_file.exists():
                self.totals = UsageTotals.from_json(totals_file.read_text())

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
        with (self._dir / "usage.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")
        # Write-then-rename, so a crash never leaves half a totals file.
        tmp = self._dir / "usage.json.tmp"
        tmp.write_text(self.totals.to_json())
        os.replace(tmp, self._dir / "usage.json")
