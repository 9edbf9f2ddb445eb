"""`corral logs -f`: every event once, in order, across the reader's pages and its switch from
the live harness to the archive (docs/history.md)."""

from __future__ import annotations

from typing import Any

import pytest

from corral_cli import logs_cmd
from corral_cli._reader import ReaderClient

TOOL = {"toolUseId": "t1", "name": "bash"}
TRANSCRIPT: list[dict[str, Any]] = [
    {"type": "submission_started"},
    {"type": "route", "route": "reactive", "handler": "reactive"},
    {"type": "message", "role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]},
    {"type": "tool_start", **TOOL, "input": {"command": "echo step-one"}},
    {"type": "tool_end", **TOOL, "isError": False, "result": "step-one"},
    {"type": "step_boundary", "step": 1},
    {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "All done."}]},
    {"type": "settled", "status": "completed", "text": "All done."},
]
TRANSCRIPT = [{"offset": n, "submissionId": "s1", **e} for n, e in enumerate(TRANSCRIPT)]


class _Reader:
    """The reader's answers in turn: a live page that ends between the tool call's start and
    its end, one more live page, the pod gone before its archive (nothing to read), then the
    archive from the offset asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.pages = [("live", 4, "Running"), ("live", 2, "Running"), ("none", 0, "Running"),
                      ("archive", None, "Succeeded"), ("archive", None, "Succeeded")]  # fmt: skip

    async def transcript(self, offset: int = 0, wait: float = 0) -> dict[str, Any]:
        self.asked.append(offset)
        source, most, phase = self.pages.pop(0)
        events = [e for e in TRANSCRIPT if e["offset"] >= offset][:most]
        final = source == "archive"
        return {"events": events, "offset": offset + len(events), "source": source,
                "phase": phase, "final": final}  # fmt: skip

    async def aclose(self) -> None:
        pass


class _Kube:
    async def close(self) -> None:
        pass


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> _Reader:
    fake = _Reader()

    async def connect(args: Any) -> tuple[_Kube, str]:
        return _Kube(), "agents"

    async def from_args(args: Any, kube: Any, namespace: str) -> _Reader:
        return fake

    monkeypatch.setattr(logs_cmd, "connect", connect)
    monkeypatch.setattr(ReaderClient, "from_args", from_args)
    monkeypatch.setattr(logs_cmd, "IDLE_POLL", 0.0)
    return fake


def test_follow_shows_each_event_once_across_pages_and_the_switch_to_the_archive(
    reader: _Reader, capsys: pytest.CaptureFixture[str]
) -> None:
    assert logs_cmd.main(["c1", "-f", "--archive-url", "http://reader"]) == 0
    assert reader.asked == [0, 4, 6, 6, 8]
    assert capsys.readouterr().out.splitlines() == [
        "route: reactive via reactive",
        "▶ bash echo step-one",
        "  ◀ ok: step-one",
        "assistant: All done.",
        "session c1: Succeeded (8 events)",
    ]
