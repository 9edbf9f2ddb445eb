"""The event-stream parser (`corral_common.sse`), held to one table of streams, and the two
readers built on it held to the same table: the custodian's usage reader (what a stream is
charged) and the lean engine's reader (what the harness builds from it). Each stream is fed
in every two-chunk split (so every byte boundary, between a CR and its LF too), one byte at a
time, and, for the engine, as the small HTTP client hands it over (line by line).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from corral_common.sse import Event, EventStreamParser, EventTooLarge
from corral_custodian.budget import CallUsage, StreamUsageReader, stream_charge
from corral_harness.engine._accumulate import MessageBuilder
from corral_harness.engine._loop import StreamFailure
from corral_harness.engine.lean_engine import _read_stream

START = {
    "type": "message_start",
    "message": {
        "model": "claude-haiku-4-5",
        "usage": {"input_tokens": 1000, "output_tokens": 1, "cache_read_input_tokens": 200},
    },
}
BLOCK = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
DELTA = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hé"}}
BLOCK_STOP = {"type": "content_block_stop", "index": 0}
USAGE = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn"},
    "usage": {"output_tokens": 500},
}
STOP = {"type": "message_stop"}
ANSWER = [START, BLOCK, DELTA, BLOCK_STOP, USAGE, STOP]


def _compact(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False)


def _lines(data: dict[str, Any]) -> list[str]:
    """The JSON of an event cut into several `data` lines (JSON allows a newline between two
    tokens): the parser must join them with LF for the JSON to read as one."""
    text = _compact(data)
    cuts = [i + 1 for i, c in enumerate(text) if c == ","][:3]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes
    events: list[Event]  # what the parser dispatches
    finished: bool = True  # message_stop among them

    @property
    def usage(self) -> tuple[int, int]:
        return (1000, 500)  # every case carries message_start's input and message_delta's output


def _stream(
    *,
    eol: str = "\n",
    space: str = " ",
    multiline: bool = False,
    extras: bool = False,
    bom: bool = False,
    last_blank: bool = True,
    eols: tuple[str, ...] = (),
) -> tuple[bytes, list[Event]]:
    """An encoding of ANSWER and the events it must parse to. `eols` cycles line ends."""
    out: list[str] = []
    events: list[Event] = []
    ends = iter(eols * 1000) if eols else None

    def line(text: str) -> None:
        out.append(text + (next(ends) if ends else eol))

    if extras:
        line(": a comment, ignored")
        line("retry: 3000")
        line("event: ping")  # an event with no data is not dispatched
        line("")
    for i, data in enumerate(ANSWER):
        name = str(data["type"])
        parts = _lines(data) if multiline else [_compact(data)]
        if extras and i == 2:
            line("id: 7")
            line("unknown-field: ignored")
            line("noColonField")
            line(":another comment")
        line(f"event:{space}{name}")
        for part in parts:
            line(f"data:{space}{part}")
        if i < len(ANSWER) - 1 or last_blank:
            line("")
        events.append(Event(name, "\n".join(parts), "7" if extras and i >= 2 else ""))
    if not last_blank:
        events.pop()  # cut before its blank line: not dispatched
    raw = ("".join(out)).encode()
    return (b"\xef\xbb\xbf" + raw if bom else raw), events


def _case(name: str, **options: Any) -> Case:
    raw, events = _stream(**options)
    return Case(name, raw, events, finished=options.get("last_blank", True))


CASES = [
    _case("lf"),
    _case("crlf", eol="\r\n"),
    _case("lone-cr", eol="\r"),
    _case("mixed-line-ends", eols=("\r\n", "\n", "\r")),
    _case("multi-line-data", multiline=True),
    _case("multi-line-data-lone-cr", multiline=True, eol="\r"),
    _case("multi-line-data-crlf", multiline=True, eol="\r\n"),
    _case("comments-ids-and-ignored-fields", extras=True, eol="\r\n"),
    _case("no-space-after-the-colon", space=""),
    _case("byte-order-mark", bom=True, eol="\r"),
    _case("no-blank-line-at-the-end", last_blank=False),
    _case("no-blank-line-at-the-end-cr", last_blank=False, eol="\r", multiline=True),
]


def _chunkings(raw: bytes) -> Iterator[list[bytes]]:
    for i in range(len(raw) + 1):
        yield [raw[:i], raw[i:]]
    yield [raw[i : i + 1] for i in range(len(raw))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_parser_reads_every_case_in_any_chunking(case: Case) -> None:
    for chunks in _chunkings(case.raw):
        parser = EventStreamParser()
        events = [event for chunk in chunks for event in parser.feed(chunk)]
        assert events == case.events, chunks
        assert parser.close() == (not case.finished)
    # Line by line, as a transport that splits at LF hands the stream over.
    parser = EventStreamParser()
    *whole, rest = case.raw.split(b"\n")
    lines = [*whole, rest] if rest else whole
    assert [event for line in lines for event in parser.feed_line(line)] == case.events


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_custodians_usage_reader_charges_every_case_its_usage(case: Case) -> None:
    ask = CallUsage(model="claude-haiku-4-5", input=5000, output=4000)
    for chunks in _chunkings(case.raw):
        reader = StreamUsageReader("claude-haiku-4-5")
        for chunk in chunks:
            reader.feed(chunk)
        reader.close()
        charge = stream_charge(reader, ask, upstream_ended=True)
        assert charge.why == "" and charge.call is not None, (charge, chunks)
        assert (charge.call.input, charge.call.output) == case.usage
        assert charge.call.cache_read == 200 and reader.completed == case.finished


async def _pieces(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _as_lines(raw: bytes) -> AsyncIterator[bytes]:
    """As the small client's `lines()` hands a body over: split at LF, the LF dropped."""
    *whole, rest = raw.split(b"\n")
    for line in whole:
        yield line
    if rest:
        yield rest


async def _build(pieces: AsyncIterator[bytes], *, split_at_lf: bool = False) -> MessageBuilder:
    builder = MessageBuilder()
    await _read_stream(pieces, {}, lambda: None, builder, split_at_lf=split_at_lf)
    return builder


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_lean_engines_reader_builds_every_case(case: Case) -> None:
    async def run() -> None:
        built = [await _build(_pieces(chunks)) for chunks in _chunkings(case.raw)]
        built.append(await _build(_as_lines(case.raw), split_at_lf=True))
        for builder in built:
            assert builder.message()["content"] == [{"type": "text", "text": "hé"}]
            usage = builder.usage
            assert (usage["input_tokens"], usage["output_tokens"]) == case.usage
            # Without message_stop's blank line the engine sees a truncated stream.
            assert builder.finished == case.finished

    asyncio.run(run())


def test_an_event_or_line_past_the_cap_is_refused_not_buffered_without_end() -> None:
    parser = EventStreamParser(max_event_bytes=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(20):
            parser.feed(b"x" * 100)  # one line that never ends
    parser = EventStreamParser(max_event_bytes=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(20):
            parser.feed(b"data: " + b"y" * 100 + b"\n")  # one event that never ends
    # The custodian's reader stops following such a stream, and charges the reservation.
    reader = StreamUsageReader("claude-haiku-4-5")
    reader.feed(_stream()[0].split(b"event: message_delta")[0])
    reader.feed(b"data: " + b"z" * (17 * 1024 * 1024))
    reader.feed(b"\n\n" + b"event: message_delta\ndata: " + _compact(USAGE).encode() + b"\n\n")
    reader.close()
    ask = CallUsage(model="claude-haiku-4-5", input=5000, output=4000)
    charge = stream_charge(reader, ask, upstream_ended=True)
    assert "could not be read" in charge.why and charge.call is not None
    assert (charge.call.input, charge.call.output) == (5000, 4000)


def test_the_lean_engine_calls_a_stream_that_breaks_the_cap_a_model_error() -> None:
    async def endless() -> AsyncIterator[bytes]:
        yield b"data: "
        while True:
            yield b"x" * (1 << 20)

    with pytest.raises(StreamFailure) as failure:
        asyncio.run(_build(endless()))
    assert failure.value.kind == "model_error" and "longer than" in failure.value.message
