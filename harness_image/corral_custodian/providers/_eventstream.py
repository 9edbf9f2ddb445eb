"""The AWS event-stream framing (`application/vnd.amazon.eventstream`), decoded incrementally:
Amazon Bedrock's `InvokeModelWithResponseStream` answers in it.

A message is a prelude (its total length and its headers' length, u32 big-endian each, then a
CRC32 of those 8 bytes), the headers, the payload, and a CRC32 of everything before it. A
header is its name's length (u8), the name, a type (u8) and a value whose shape the type gives:
0 true and 1 false (no bytes), 2 a byte, 3 an int16, 4 an int32, 5 an int64, 6 bytes and 7 a
UTF-8 string (each after a u16 length), 8 a timestamp (int64 milliseconds), 9 a UUID (16 bytes).

`EventStreamDecoder.feed` takes bytes as they arrive and returns the messages they complete;
`finish` says whether the stream ended between messages. Both CRCs are checked; a bad one, an
impossible length or a malformed header raises `EventStreamError`.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

# The prelude (12 bytes) and the message CRC (4): the least a message can be.
PRELUDE_LENGTH = 12
MIN_MESSAGE_LENGTH = PRELUDE_LENGTH + 4
# The limits AWS's SDKs hold a message to; a prelude past them is corrupt, and waiting for
# gigabytes that will never come would hold the stream open for nothing.
MAX_HEADERS_LENGTH = 128 * 1024
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024

HeaderValue = bool | int | bytes | str

# Header value types with a fixed size: type -> (struct format, size).
_FIXED: dict[int, tuple[str, int]] = {
    2: (">b", 1),
    3: (">h", 2),
    4: (">i", 4),
    5: (">q", 8),
    8: (">q", 8),  # a timestamp: milliseconds since the epoch
}


class EventStreamError(ValueError):
    """The bytes are not a well-formed event stream (a CRC, a length or a header is wrong)."""


@dataclass(frozen=True)
class EventMessage:
    headers: dict[str, HeaderValue]
    payload: bytes

    def header(self, name: str) -> str | None:
        """A string header's value, or None when it is absent or not a string."""
        value = self.headers.get(name)
        return value if isinstance(value, str) else None


def _crc(data: bytes, start: int = 0) -> int:
    return zlib.crc32(data, start) & 0xFFFFFFFF


def parse_headers(data: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    at = 0
    try:
        while at < len(data):
            size = data[at]
            raw_name = data[at + 1 : at + 1 + size]
            if len(raw_name) != size:
                raise EventStreamError("a header's name runs past the headers")
            name = raw_name.decode("utf-8")
            at += 1 + size
            kind = data[at]
            at += 1
            value: HeaderValue
            if kind in (0, 1):
                value = kind == 0
            elif kind in _FIXED:
                fmt, width = _FIXED[kind]
                (value,) = struct.unpack_from(fmt, data, at)
                at += width
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", data, at)
                raw = data[at + 2 : at + 2 + length]
                if len(raw) != length:
                    raise EventStreamError(f"header {name!r} runs past the headers")
                value = raw.decode("utf-8") if kind == 7 else raw
                at += 2 + length
            elif kind == 9:
                value = data[at : at + 16]
                at += 16
            else:
                raise EventStreamError(f"header {name!r} has an unknown value type {kind}")
            if at > len(data):
                raise EventStreamError(f"header {name!r} runs past the headers")
            if name in headers:
                raise EventStreamError(f"header {name!r} is given twice")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise EventStreamError(f"malformed headers: {e}") from e
    return headers


class EventStreamDecoder:
    """Feed it the stream's bytes in any pieces; it returns each message once it is whole."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._total: int | None = None  # the message under way's length, its prelude checked

    def feed(self, data: bytes) -> list[EventMessage]:
        self._buffer += data
        out: list[EventMessage] = []
        while True:
            message = self._next()
            if message is None:
                return out
            out.append(message)

    def finish(self) -> None:
        """The stream has ended: it must have ended between two messages."""
        if self._buffer:
            raise EventStreamError(
                f"the stream ended inside a message ({len(self._buffer)} bytes of it)"
            )

    def _next(self) -> EventMessage | None:
        if self._total is None:
            if len(self._buffer) < PRELUDE_LENGTH:
                return None
            # Checked as soon as it is in: a corrupt length is refused now, not waited for.
            self._total = self._check_prelude(bytes(self._buffer[:PRELUDE_LENGTH]))
        total = self._total
        if len(self._buffer) < total:
            return None
        raw = bytes(self._buffer[:total])
        del self._buffer[:total]
        self._total = None
        (expected,) = struct.unpack_from(">I", raw, total - 4)
        if _crc(raw[: total - 4]) != expected:
            raise EventStreamError("the message's CRC does not match its bytes")
        (headers_length,) = struct.unpack_from(">I", raw, 4)
        headers_end = PRELUDE_LENGTH + headers_length
        return EventMessage(
            parse_headers(raw[PRELUDE_LENGTH:headers_end]), raw[headers_end : total - 4]
        )

    @staticmethod
    def _check_prelude(prelude: bytes) -> int:
        total, headers_length, expected = struct.unpack(">III", prelude)
        if _crc(prelude[:8]) != expected:
            raise EventStreamError("the prelude's CRC does not match its bytes")
        payload_length = total - MIN_MESSAGE_LENGTH - headers_length
        if total < MIN_MESSAGE_LENGTH or payload_length < 0:
            raise EventStreamError(
                f"impossible lengths: a message of {total} bytes with {headers_length} of headers"
            )
        if headers_length > MAX_HEADERS_LENGTH or payload_length > MAX_PAYLOAD_LENGTH:
            raise EventStreamError(
                f"a message of {total} bytes is longer than an event stream's messages may be"
            )
        return int(total)
