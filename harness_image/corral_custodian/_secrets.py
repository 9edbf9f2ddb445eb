"""Every credential value the custodian holds, in one registry, and the redactor that reads it.

The registry is the one place a credential is named: the model key, the git credentials, hook
secrets, the service-account token, the memory DSN, the wire token, the custodian credential,
and any later one. The redactor and the attack suite's canary sweep both read it. Redaction is
the second line of defence, after not reading what the agent wrote: every text the custodian
returns or records passes `redact` on its way out (`RedactResponses` on both listeners,
`RedactingFilter` on its log handlers).

A value is redacted in each form it may take in a text (`encodings`): as is, base64 (standard
and URL-safe, padded or not, and inside a longer base64 text at each of the three alignments),
URL-encoded, hex, JSON-escaped, as Python's repr; a user and password pair (`register_basic`)
also as `user:password` and as the base64 of it (HTTP Basic). The forms are computed when a
value is registered, so `redact` only searches.

Errors: `SecretTooShort` (a ValueError) when a credential is too short to be told apart from
ordinary text; the custodian refuses to start with one.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

MIN_SECRET_LENGTH = 8
MARKER = "[redacted:{name}]"
# The shortest inner part of a base64 alignment kept as a form: 8 characters are 48 bits, which
# no ordinary text matches by chance.
MIN_INNER_BASE64 = 8


class SecretTooShort(ValueError):
    """A credential shorter than MIN_SECRET_LENGTH: its redaction would rewrite ordinary text."""


def _text(value: str | bytes) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    # Surrounding whitespace (a file's trailing newline) is not part of the credential.
    return text.strip()


def _check_length(name: str, text: str) -> None:
    if len(text) < MIN_SECRET_LENGTH:
        raise SecretTooShort(
            f"the credential {name!r} is {len(text)} characters long; at least "
            f"{MIN_SECRET_LENGTH} are needed so that it can be redacted"
        )


class SecretRegistry:
    """Credential values by name; `redact` replaces each value (and its usual encodings)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: list[tuple[str, str]] = []  # (name, value), in registration order
        self._extra: list[tuple[str, str]] = []  # (name, text): forms of pairs, not values
        self._forms: tuple[tuple[str, str], ...] = ()  # (form, name), longest form first

    def register(self, name: str, value: str | bytes | None) -> None:
        """Register `value` under `name`; None or empty registers nothing, a value already
        registered under `name` nothing more (a re-read token that did not rotate)."""
        if value is None:
            return
        text = _text(value)
        if not text:
            return
        _check_length(name, text)
        with self._lock:
            if (name, text) in self._values:
                return
            self._values.append((name, text))
            self._rebuild()

    def register_basic(self, name: str, user: str, password: str) -> None:
        """Register a user and password pair (a git credential, a DSN's login): the password
        as a value, and `user:password` in every form (as in `https://user:password@host`,
        and its base64, the HTTP Basic header)."""
        secret = _text(password)
        if not secret:
            return
        _check_length(name, secret)
        self.register(name, secret)
        if not user:
            return
        with self._lock:
            added = False
            for pair in (f"{user}:{secret}", f"{quote(user, safe='')}:{quote(secret, safe='')}"):
                if (name, pair) not in self._extra:
                    self._extra.append((name, pair))
                    added = True
            if added:
                self._rebuild()

    def _rebuild(self) -> None:
        forms: dict[str, str] = {}
        for name, value in [*self._values, *self._extra]:
            for form in encodings(value):
                forms.setdefault(form, name)
        self._forms = tuple(sorted(forms.items(), key=lambda pair: len(pair[0]), reverse=True))

    def values(self) -> list[str]:
        """Every registered credential value (not its encodings: `encodings` gives those)."""
        with self._lock:
            return [value for _, value in self._values]

    def __bool__(self) -> bool:
        return bool(self._forms)

    def forms(self) -> list[tuple[str, str]]:
        """(form, name) for every form `redact` replaces, longest first."""
        return list(self._forms)

    def clear(self) -> None:
        """Forget every value (tests only: a process registers what it holds once)."""
        with self._lock:
            self._values.clear()
            self._extra.clear()
            self._forms = ()

    def redact(self, text: str) -> str:
        """`text` with each occurrence of every form replaced by its credential's marker.
        Occurrences are found first and overlapping ones merged, so two credentials that
        overlap in the text (or a value inside another) are both covered entirely."""
        forms = self._forms
        if not forms or not text:
            return text
        spans: list[tuple[int, int, str]] = []
        for form, name in forms:
            at = text.find(form)
            while at != -1:
                spans.append((at, at + len(form), name))
                at = text.find(form, at + 1)
        if not spans:
            return text
        spans.sort()
        out: list[str] = []
        pos = 0
        start, end, names = spans[0][0], spans[0][1], [spans[0][2]]
        for s, e, name in spans[1:]:
            if s <= end:
                end = max(end, e)
                if name not in names:
                    names.append(name)
                continue
            out += [text[pos:start], MARKER.format(name=",".join(names))]
            pos, start, end, names = end, s, e, [name]
        out += [text[pos:start], MARKER.format(name=",".join(names)), text[end:]]
        return "".join(out)


def _base64_forms(raw: bytes) -> set[str]:
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        full = encode(raw).decode("ascii")
        forms.update((full, full.rstrip("=")))
        # Inside a longer base64 text the value starts at one of three byte alignments. Only
        # the characters whose 6 bits all come from the value's bytes are stable: the first
        # group shares bits with the bytes before the value, the last with those after it.
        for offset in range(3):
            encoded = encode(b"\0" * offset + raw).decode("ascii")
            tail = (offset + len(raw)) % 3
            first = (0, 2, 3)[offset]
            last = 4 * ((offset + len(raw)) // 3) + (0, 1, 2)[tail]
            inner = encoded[first:last]
            if len(inner) >= MIN_INNER_BASE64:
                forms.add(inner)
    return forms


def _url_forms(value: str) -> set[str]:
    forms = {quote(value, safe=""), quote(value), quote_plus(value, safe=""), quote_plus(value)}
    # quote writes upper-case escapes; other encoders write lower-case ones.
    for form in list(forms):
        if "%" in form:
            forms.add(_lower_escapes(form))
    return forms


def _lower_escapes(form: str) -> str:
    parts = form.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


def _json_forms(value: str) -> set[str]:
    forms = {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    units = value.encode("utf-16-be")
    escaped = "".join(
        f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)
    )
    forms.update((escaped, escaped.upper().replace("\\U", "\\u")))
    return forms


def encodings(value: str) -> list[str]:
    """The forms in which `value` may appear in a text, the value first."""
    raw = value.encode("utf-8")
    forms = _base64_forms(raw) | _url_forms(value) | _json_forms(value)
    forms.update((raw.hex(), raw.hex().upper()))
    # Python's repr (a `%r` in a log line, an exception's args): backslashes doubled, quotes
    # and unprintable characters escaped.
    forms.update((repr(value)[1:-1], ascii(value)[1:-1]))
    # A form with a quote or backslash (a \u escape) inside a JSON string, as the custodian's
    # JSON answers carry it.
    forms.update(
        [json.dumps(form)[1:-1] for form in (value, *forms) if '"' in form or "\\" in form]
    )
    forms.discard(value)
    return [value, *sorted(form for form in forms if form)]


registry = SecretRegistry()


def register(name: str, value: str | bytes | None) -> None:
    registry.register(name, value)


def register_basic(name: str, user: str, password: str) -> None:
    registry.register_basic(name, user, password)


def redact(text: str) -> str:
    """`text` with every registered credential (in every known form) replaced by a marker."""
    return registry.redact(text)


def redact_bytes(data: bytes, secrets: SecretRegistry | None = None) -> bytes:
    """`redact` over bytes; bytes that are not UTF-8 pass through unchanged around it."""
    secrets = registry if secrets is None else secrets
    if not secrets:
        return data
    text = data.decode("utf-8", "surrogateescape")
    redacted = secrets.redact(text)
    return data if redacted == text else redacted.encode("utf-8", "surrogateescape")


# --- logs --------------------------------------------------------------------------------------

_EXCEPTION_FORMATTER = logging.Formatter()
# LogRecord's own attributes: anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


def _redact_value(value: Any, secrets: SecretRegistry) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): _redact_value(v, secrets) for k, v in value.items()}
    return secrets.redact(str(value))


class RedactingFilter(logging.Filter):
    """On a handler: every record it writes leaves with its message (args merged in), its
    exception and stack text and its `extra` values redacted. The exception is rendered here
    and kept as text (`exc_text`, which the text format prints, and the `exception` field,
    which the JSON format writes), since a traceback object cannot be redacted."""

    def __init__(self, secrets: SecretRegistry | None = None) -> None:
        super().__init__()
        self._secrets = registry if secrets is None else secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep what there is, still redacted
            message = f"{record.msg} {record.args}"
        redact = self._secrets.redact
        record.msg, record.args = redact(message), None
        if record.exc_info:
            text = record.exc_text or _EXCEPTION_FORMATTER.formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = redact(text)
            record.exception = record.exc_text
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(record.__dict__.items()):
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                record.__dict__[key] = _redact_value(value, self._secrets)
        return True


def redact_handlers(handlers: Iterable[logging.Handler]) -> None:
    """Put one `RedactingFilter` on each handler (once)."""
    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


# --- responses ---------------------------------------------------------------------------------

MODEL_PATH = "/v1/messages"


class RedactResponses:
    """ASGI layer in front of a listener: every response body leaves redacted, whole (the
    bodies are JSON the custodian built, or a short answer it relayed), with its
    content-length set again. The one exception is the model proxy's event stream from the
    provider, passed through chunk by chunk as it arrives: the model never saw a credential
    (the key goes in a header upstream, never into a prompt), and buffering the stream to
    redact it would hold every token back until the answer ended."""

    def __init__(self, app: ASGIApp, secrets: SecretRegistry | None = None) -> None:
        self.app = app
        self._secrets = registry if secrets is None else secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        start: Message | None = None
        chunks: list[bytes] = []
        streaming = False

        async def send_redacted(message: Message) -> None:
            nonlocal start, streaming
            if message["type"] == "http.response.start":
                if path == MODEL_PATH and _is_event_stream(message):
                    streaming = True
                    await send(message)
                else:
                    start = message
                return
            if message["type"] != "http.response.body" or streaming or start is None:
                await send(message)
                return
            chunks.append(bytes(message.get("body", b"")))
            if message.get("more_body"):
                return
            body = redact_bytes(b"".join(chunks), self._secrets)
            chunks.clear()
            headers = [
                (k, v) for k, v in start.get("headers", ()) if bytes(k).lower() != b"content-length"
            ]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            start = None
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_redacted)


def _is_event_stream(message: Message) -> bool:
    for key, value in message.get("headers", ()):
        if bytes(key).lower() == b"content-type":
            return bytes(value).lower().startswith(b"text/event-stream")
    return False
