"""The table of streams the shared event-stream parser is held to (tests/unit/common/test_sse.py:
LF, CRLF, lone CR, mixed line ends, multi-line `data`, comments and ignored fields, a byte order
mark, a last event without its blank line), sent over a real socket to every engine adapter:
the SDK adapter (the official SDK over real HTTP), and the lean adapter over its small client
and over httpx. Each must build the same answer from every case.

Each stream is written in pieces that end at its line ends (so a piece may end between a CR and
its LF), and the connection is then held open until the engine has read `message_stop`: an
engine must read each event as it arrives, not when the stream ends. A reader that waits for
LF sees nothing of a lone-CR stream until then.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from corral_harness.engine._accumulate import MessageBuilder
from corral_harness.engine._loop import StreamingEngine
from corral_harness.engine.anthropic_engine import AnthropicEngine
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.seam import MessageEnd, Usage
from tests.unit.common.test_sse import CASES, Case

from .test_engine_streams import RawServer, _run, stream

pytestmark = pytest.mark.timeout(120)

HOLD_SECONDS = 5.0  # how long the server waits, the stream sent, for the engine to have read it


class LeanOverHttpx(LeanEngine):
    direct = False


ADAPTERS: dict[str, type[StreamingEngine]] = {
    "sdk": AnthropicEngine,
    "lean": LeanEngine,
    "lean-httpx": LeanOverHttpx,
}


def _pieces(response: bytes) -> list[bytes]:
    """The head, then the body cut after every CR and every LF."""
    head, _, body = response.partition(b"\r\n\r\n")
    return [head + b"\r\n\r\n", *(p for p in re.split(rb"(?<=[\r\n])", body) if p)]


class PacedServer(RawServer):
    """Writes each response piece by piece, then, when `hold`, keeps the connection open until
    the engine has read message_stop (or HOLD_SECONDS pass); `held` says which came first."""

    def __init__(self, responses: list[bytes], read: threading.Event, *, hold: bool) -> None:
        self.read = read
        self.hold = hold
        self.held: list[bool] = []
        super().__init__(responses)

    def _answer(self, conn: socket.socket, response: bytes) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in _pieces(response):
            conn.sendall(piece)
            time.sleep(0.001)  # a piece of its own on the wire, as a slow upstream sends it
        if self.hold:
            self.held.append(self.read.wait(HOLD_SECONDS))


@pytest.fixture
def read_to_the_end(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when an engine's message builder has been handed message_stop."""
    done = threading.Event()
    on_event = MessageBuilder.on_event

    def watched(self: MessageBuilder, event: Any) -> None:
        on_event(self, event)
        if self.finished:
            done.set()

    monkeypatch.setattr(MessageBuilder, "on_event", watched)
    return done


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_every_adapter_reads_every_framing_as_it_arrives(
    name: str, case: Case, tmp_path: Path, read_to_the_end: threading.Event
) -> None:
    server = PacedServer([stream(case.raw)], read_to_the_end, hold=case.finished)
    try:
        outcome, seen = await _run(ADAPTERS[name], server, tmp_path)
    finally:
        server.close()
    [end] = [e for e in seen if isinstance(e, MessageEnd)]
    assert end.message["content"] == [{"type": "text", "text": "hé"}]
    assert end.usage == Usage(input=1000, output=500, cache_read=200)
    assert len(server.bodies) == 1  # text was forwarded: a failure is not retried
    if case.finished:
        assert server.held == [True], "the engine read message_stop only when the stream ended"
        assert outcome.status == "completed", outcome.error
        assert end.stop_reason == "end_turn"
    else:
        # message_stop without its blank line is not an event: the stream stopped short.
        assert outcome.status == "failed" and end.stop_reason == "error"
        assert outcome.error is not None and outcome.error.type == "stream_truncated"
