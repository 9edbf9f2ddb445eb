"""Log lines of the operator, the harness and the custodian: JSON or text, with the run id.

One format switch for the three processes: `--log-format json|text` on the operator, and the
`CORRAL_LOG_FORMAT` variable for every process (the operator sets it on the harness and the
custodian of each sandbox pod it builds). A JSON line is one object:

    {"time": "...Z", "level": "INFO", "logger": "...", "message": "...",
     "runId": "fix-bug.2", "session": "agents/fix-bug", ...}

`runId` and `session` come from the context the line was logged in (`bind`, `bound`): the
operator binds the Session its loop drives and the run it admitted, the harness the run it is
running, the custodian the run named by the request's `X-Corral-Run-Id`. Context variables
follow asyncio tasks, so concurrent turns never mix their ids. docs/observability.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from typing import Any, Literal, TextIO

LOG_FORMAT_ENV = "CORRAL_LOG_FORMAT"
LogFormat = Literal["json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The fields every line logged in this context carries (run id, session, ...).
_fields: ContextVar[Mapping[str, str] | None] = ContextVar("corral_log_fields", default=None)

# LogRecord's own attributes: anything else on a record came from `extra=` and is kept.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


def bind(**fields: str | None) -> Token[Mapping[str, str] | None]:
    """Add `fields` to every line logged from here on in this context (None removes one)."""
    merged = dict(_fields.get() or {})
    for key, value in fields.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return _fields.set(merged)


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """`bind` for a block: the fields are gone again after it."""
    token = bind(**fields)
    try:
        yield
    finally:
        _fields.reset(token)


def current() -> Mapping[str, str]:
    """The fields bound in this context."""
    return _fields.get() or {}


def parse_format(text: str | None, default: LogFormat = "text") -> LogFormat:
    """`json` or `text` (any case); empty means `default`; anything else is refused."""
    value = (text or "").strip().lower()
    if not value:
        return default
    if value not in LOG_FORMATS:
        raise ValueError(f"{LOG_FORMAT_ENV}/--log-format must be json or text, not {text!r}")
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ms), level, logger, message, the bound fields,
    the record's `extra` values and the exception, if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(current())
        for key, value in record.__dict__.items():
            if key == "k8s_ref" and isinstance(value, Mapping):
                # kopf's per-object loggers name the object they speak of.
                line.setdefault("object", f"{value.get('namespace') or ''}/{value.get('name')}")
            elif key.startswith(("_", "k8s_")) or key in _RECORD_ATTRIBUTES or key in line:
                continue
            else:
                line[key] = _plain(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The plain format, with the bound run id appended when there is one."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        run = current().get("runId")
        return f"{text} [run {run}]" if run else text


def _plain(value: Any) -> Any:
    """An `extra` value as JSON can carry it (kopf's object reference is a mapping)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def configure(
    log_format: LogFormat, level: int = logging.INFO, stream: TextIO | None = None
) -> None:
    """Send every logger's lines to `stream` (stderr) in `log_format`, replacing any handler
    the root logger had."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # a library's warning is a line in the same format too
