"""An incremental server-sent-events parser over bytes (the WHATWG event-stream format).

The one reader of the Messages API stream: the custodian's usage reader observes the bytes it
relays with it, and the harness's lean engine builds its messages with it, so both see the same
events in the same bytes. A line ends at LF, CRLF or a lone CR (a CR at the end of a chunk may
be the first half of a CRLF; the LF that may start the next chunk is then skipped). A line
`field: value` (one space after the colon dropped, none needed) sets `event` or `id` or adds a
`data` line; `data` lines are joined with LF; a line starting with `:` is a comment; a line
without a colon is a field with an empty value; `retry` (a reconnecting client's delay) and
unknown fields are ignored; a blank line dispatches the event, if it has data. A leading byte
order mark is dropped. At the end of the stream an event without its blank line is dropped,
as the format says: a reader then sees a stream that stopped short.

Pure: no I/O. Each chunk's bytes are scanned a constant number of times, and a line cut across
chunks is kept in pieces until its end comes, so the work is linear in the stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024  # a Messages API event is a few KB at most


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event: its type ("message" when the stream names none), its data lines
    joined with LF, and the last event id seen ("" when none)."""

    event: str
    data: str
    id: str = ""


_NONE: tuple[Event, ...] = ()


class EventTooLarge(ValueError):
    """One event (or one line) ran past the parser's cap before it ended."""


class EventStreamParser:
    """Feed it the stream's bytes in any chunking (`feed`), or its lines split at LF
    (`feed_line`); each call returns the events it completed, in order."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._line: list[bytes] = []  # the pieces of a line not yet ended
        self._line_size = 0
        self._skip_lf = False  # the last chunk ended in CR: an LF starting the next one is its pair
        self._bom_pending = True  # nothing seen yet: a byte order mark may still be coming
        self._data: list[bytes] = []
        self._data_size = 0
        self._event = b""
        self._id = ""

    @property
    def pending(self) -> bool:
        """Part of an event (a line or data not yet dispatched) is waiting for its end."""
        return bool(self._line or self._data or self._event)

    def feed(self, chunk: bytes) -> Sequence[Event]:
        if self._bom_pending:
            chunk = self._strip_bom(chunk)
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if b"\r" in chunk:
            # Every line end becomes LF. A CR closing the chunk ends its line now; if the next
            # chunk opens with LF, that LF belongs to this CR and is skipped.
            self._skip_lf = chunk[-1] == 0x0D
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        last = lines.pop()
        out: list[Event] = []
        if lines:
            first = lines[0]
            if self._line:
                self._line.append(first)
                first = b"".join(self._line)
                self._line = []
                self._line_size = 0
            lines[0] = first
            for line in lines:
                if not line:
                    event = self._dispatch()
                    if event is not None:
                        out.append(event)
                else:
                    self._field(line)
        if last:
            self._line_size += len(last)
            if self._line_size > self._max:
                raise EventTooLarge(f"a line of the stream is longer than {self._max} bytes")
            self._line.append(last)
        return out

    def feed_line(self, line: bytes) -> Sequence[Event]:
        """One line from a transport that splits the stream at LF and drops the LF: the same
        as `feed(line + b"\n")`, without the copy and the search for line ends, since a line
        with no CR in it (the usual one) is a whole line already."""
        if self._line or self._skip_lf or self._bom_pending or b"\r" in line:
            return self.feed(line + b"\n")
        if line:
            self._field(line)
            return _NONE
        event = self._dispatch()
        return _NONE if event is None else (event,)

    def close(self) -> bool:
        """The stream ended: what was not dispatched is dropped. True when that was something
        (the stream stopped inside an event)."""
        dropped = self.pending
        self._line, self._line_size = [], 0
        self._data, self._data_size, self._event = [], 0, b""
        self._skip_lf = False
        return dropped

    def _strip_bom(self, chunk: bytes) -> bytes:
        held = b"".join(self._line) + chunk if self._line else chunk
        if len(held) < len(_BOM) and _BOM.startswith(held):
            # Could still be a byte order mark cut across chunks: hold it as a line piece.
            self._line = [held] if held else []
            self._line_size = len(held)
            return b""
        self._bom_pending = False
        self._line = []
        self._line_size = 0
        return held[len(_BOM) :] if held.startswith(_BOM) else held

    def _field(self, line: bytes) -> None:
        if line[0] == 0x3A:  # ":" a comment
            return
        if line.startswith(b"data:"):  # the most common line, found without partition
            name, value = b"data", line[5:]
        else:
            name, _, value = line.partition(b":")  # no colon: the whole line names the field
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data_size += len(value) + 1
            if self._data_size > self._max:
                raise EventTooLarge(f"an event of the stream is larger than {self._max} bytes")
            self._data.append(value)
        elif name == b"event":
            self._event = value
        elif name == b"id" and b"\0" not in value:
            self._id = value.decode("utf-8", "replace")
        # `retry` sets a reconnecting EventSource's delay; nothing here reconnects.

    def _dispatch(self) -> Event | None:
        data, name = self._data, self._event
        self._data, self._data_size, self._event = [], 0, b""
        if not data:
            return None
        text = (data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace")
        return Event(name.decode("utf-8", "replace") if name else "message", text, self._id)
