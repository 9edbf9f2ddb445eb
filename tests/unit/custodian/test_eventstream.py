"""The custodian's AWS event-stream decoder, held to botocore's: frames written by the Bedrock
stand-in's encoder (every header type) decode alike with both, in one piece and byte by byte,
and both refuse the same corruptions."""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Callable

import pytest
from botocore.eventstream import EventStreamBuffer, ParserError  # type: ignore[import-untyped]

from corral_custodian.providers._eventstream import (
    EventMessage,
    EventStreamDecoder,
    EventStreamError,
    parse_headers,
)
from corral_dev.providers._bedrock import (
    chunk_frame,
    encode_header,
    encode_message,
    exception_frame,
)

pytestmark = pytest.mark.timeout(60)

EVERY_TYPE = [
    encode_header("yes", True),
    encode_header("no", False),
    encode_header("byte", -7, 2),
    encode_header("short", -30000, 3),
    encode_header("int", 2_000_000_000, 4),
    encode_header("long", -(2**60), 5),
    encode_header("bytes", b"\x00\x01\xff"),
    encode_header("string", "héllo, wörld"),
    encode_header("timestamp", 1_700_000_000_123, 8),
    encode_header("uuid", uuid.UUID(int=12345).bytes, 9),
]


def botocore_messages(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), bytes(m.payload)) for m in buffer]


def ours(messages: list[EventMessage]) -> list[tuple[dict[str, object], bytes]]:
    return [(dict(m.headers), m.payload) for m in messages]


def frames() -> bytes:
    return b"".join(
        [
            encode_message(EVERY_TYPE, b'{"every": "type"}'),
            encode_message([], b""),
            chunk_frame(b'{"type": "message_stop"}'),
            exception_frame("throttlingException", "Too many requests, please wait."),
        ]
    )


def test_every_header_type_decodes_as_botocore_decodes_it() -> None:
    data = frames()
    expected = botocore_messages(data)
    assert len(expected) == 4
    decoder = EventStreamDecoder()
    whole = ours(decoder.feed(data))
    decoder.finish()
    assert whole == expected
    assert whole[0][0]["string"] == "héllo, wörld" and whole[0][0]["no"] is False
    # Byte by byte: a message comes out exactly when its last byte is in.
    decoder = EventStreamDecoder()
    piecewise = [m for i in range(len(data)) for m in decoder.feed(data[i : i + 1])]
    decoder.finish()
    assert ours(piecewise) == expected


def _with_crc(body: bytes) -> bytes:
    return body + struct.pack(">I", zlib.crc32(body))


def _corrupt_prelude_crc(frame: bytes) -> bytes:
    return frame[:8] + bytes([frame[8] ^ 1]) + frame[9:]


def _corrupt_payload(frame: bytes) -> bytes:
    return frame[:-5] + bytes([frame[-5] ^ 1]) + frame[-4:]


def _impossible_length(frame: bytes) -> bytes:
    # Ten bytes in all, its CRC right: shorter than a prelude and a CRC.
    prelude = struct.pack(">II", 10, 0)
    return _with_crc(prelude) + b"\x00" * 8


def _headers_past_the_end(frame: bytes) -> bytes:
    prelude = struct.pack(">II", 20, 30)
    return _with_crc(prelude) + b"\x00" * 20


def _too_long(frame: bytes) -> bytes:
    prelude = struct.pack(">II", 200 * 1024 * 1024, 0)
    return _with_crc(prelude)


@pytest.mark.parametrize(
    ("corrupt", "says"),
    [
        (_corrupt_prelude_crc, "prelude's CRC"),
        (_corrupt_payload, "message's CRC"),
        (_impossible_length, "impossible lengths"),
        (_headers_past_the_end, "impossible lengths"),
        (_too_long, "longer than"),
    ],
    ids=["prelude-crc", "message-crc", "too-short", "headers-past-end", "too-long"],
)
def test_a_corrupt_frame_is_refused_by_both(corrupt: Callable[[bytes], bytes], says: str) -> None:
    data = corrupt(chunk_frame(b'{"type": "ping"}'))
    with pytest.raises(EventStreamError, match=says):
        EventStreamDecoder().feed(data)
    if says != "longer than":  # botocore only learns of that one once the bytes are in
        with pytest.raises(ParserError):
            botocore_messages(data)


def test_a_stream_that_ends_inside_a_message_is_refused_at_its_end() -> None:
    frame = chunk_frame(b'{"type": "ping"}')
    decoder = EventStreamDecoder()
    assert decoder.feed(frame + frame[:20]) != []
    with pytest.raises(EventStreamError, match="ended inside a message"):
        decoder.finish()


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        (b"\x03abc\x0b", "unknown value type"),
        (b"\x03abc\x07\x00\x09abc", "runs past"),
        (b"\x09abc", "runs past"),
        (encode_header("a", "x") + encode_header("a", "y"), "given twice"),
        (b"\x03abc\x04\x00\x01", "malformed"),
    ],
    ids=["unknown-type", "string-past-end", "name-past-end", "twice", "int-past-end"],
)
def test_malformed_headers_are_refused(headers: bytes, says: str) -> None:
    with pytest.raises(EventStreamError, match=says):
        parse_headers(headers)
    with pytest.raises(EventStreamError, match=says):
        EventStreamDecoder().feed(encode_message([headers], b"{}"))
