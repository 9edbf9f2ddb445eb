"""The local record of a `corral run`: a state directory a user can read.

state.json        the driver's state (phase, turns, admission ledger, usage), written
                  atomically: a reader or a crash never sees half a file
ledger.jsonl      append-only, one line per admission and one per settlement (the turn's
                  receipt: status, usage, tools run and blocked, evaluation, outcome)
transcript.jsonl  every wire event, as received
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from corral_operator.driver import DriverState

STATE_FILE = "state.json"
_SETTLED_FIELDS = frozenset(
    {"offset", "type", "submissionId", "status", "error", "usage", "text", "ts"}
)
LEDGER_FILE = "ledger.jsonl"
TRANSCRIPT_FILE = "transcript.jsonl"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


class LocalTurnStore:
    """A `TurnStore` over `state.json` in a directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        return self.state_dir / STATE_FILE

    async def load(self) -> DriverState:
        if not self.path.exists():
            return DriverState()
        return DriverState.model_validate_json(self.path.read_text())

    async def save(self, state: DriverState) -> None:
        write_atomically(self.path, state.model_dump_json(by_alias=True, indent=2) + "\n")


def _outcome(decision: dict[str, Any]) -> str:
    if decision.get("action") == "continue":
        return "partial"
    return {
        "Succeeded": "success",
        "WaitingForWake": "success",  # the turn was accepted; the session waits for its wake
        "WaitingForHuman": "handed_to_human",
        "WaitingForChildren": "waiting_for_children",
        "Stopped": "stopped",
    }.get(str(decision.get("phase")), "failed")


class RunRecord:
    """Writes the transcript and the ledger from the driver's event stream."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.ledger_path = state_dir / LEDGER_FILE
        self.transcript_path = state_dir / TRANSCRIPT_FILE
        self._run: Counter[str] = Counter()
        self._blocked: Counter[str] = Counter()
        self._by_name: dict[str, Counter[str]] = {}
        self._steps: Counter[str] = Counter()
        self._harness_receipt: dict[str, dict[str, Any]] = {}
        self._seen: set[tuple[str, int]] = set()

    def record(self, event: dict[str, Any]) -> None:
        if event.get("source") == "driver":
            self._driver_event(event)
            return
        _append(self.transcript_path, event)
        submission = str(event.get("submissionId", ""))
        key = (submission, int(event.get("offset", -1)))
        if key in self._seen:  # a re-attach reads some events twice; count them once
            return
        self._seen.add(key)
        kind = event.get("type")
        if kind == "tool_end":
            self._run[submission] += 1
            self._by_name.setdefault(submission, Counter())[str(event.get("name"))] += 1
        elif kind == "tool_blocked":
            self._blocked[submission] += 1
        elif kind == "step_boundary":
            self._steps[submission] += 1
        elif kind == "settled":
            # Whatever the harness adds to its settlement beyond the wire's fields, kept as is.
            extra = {k: v for k, v in event.items() if k not in _SETTLED_FIELDS}
            if extra:
                self._harness_receipt[submission] = extra

    def _driver_event(self, event: dict[str, Any]) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        submission = str(event.get("submissionId", ""))
        if event["type"] == "admitted":
            _append(
                self.ledger_path,
                {
                    "kind": "admission",
                    "at": now,
                    "turn": event["turn"],
                    "submissionId": submission,
                    "message": event.get("message", ""),
                },
            )
        elif event["type"] == "settled":
            decision = event.get("decision") or {}
            _append(
                self.ledger_path,
                {
                    "kind": "settlement",
                    "at": now,
                    "turn": event["turn"],
                    "submissionId": submission,
                    "status": event["status"],
                    "error": event.get("error"),
                    "usage": event.get("usage"),
                    "toolsRun": self._run[submission],
                    "toolsBlocked": self._blocked[submission],
                    "toolsByName": dict(self._by_name.get(submission, {})),
                    "steps": self._steps[submission],
                    "requestedLoop": event.get("loop"),
                    "harness": self._harness_receipt.get(submission),
                    "pick": event.get("pick"),
                    "evaluation": event.get("evaluation"),
                    "decision": decision,
                    "outcome": _outcome(decision),
                },
            )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
