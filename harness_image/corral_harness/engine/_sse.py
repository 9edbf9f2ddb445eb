"""A server-sent-events reader for the Messages API stream (the WHATWG event-stream format).

Lines are `field: value`; `event` names the event, `data` lines are joined with newlines, a
line starting with `:` is a comment, and a blank line ends the event. An event cut off before
its blank line is dropped, as the format says: the engine then sees a stream without
`message_stop` and calls it truncated.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSentEvent:
    event: str | None
    data: str


async def read_events(lines: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if event is not None or data:
                yield ServerSentEvent(event, "\n".join(data))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        # `id` and `retry` are for reconnecting EventSource clients; a model call never resumes.
