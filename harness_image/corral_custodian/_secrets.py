"""Every credential value the custodian holds, in one registry, and the redactor that reads it.

The registry is the one place a credential is named: the model key, the git credentials, hook
secrets, the service-account token, the memory DSN, the wire token, the custodian credential,
and any later one. The redactor and the attack suite's canary sweep both read it. Redaction is
the second line of defence, after not reading what the agent wrote: every text the custodian
returns or records passes `redact` on its way out.

Errors: `SecretTooShort` (a ValueError) when a credential is too short to be told apart from
ordinary text; the custodian refuses to start with one.
"""

from __future__ import annotations

import threading

MIN_SECRET_LENGTH = 8
MARKER = "[redacted:{name}]"


class SecretTooShort(ValueError):
    """A credential shorter than MIN_SECRET_LENGTH: its redaction would rewrite ordinary text."""


class SecretRegistry:
    """Credential values by name; `redact` replaces each value (and its usual encodings)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}
        self._forms: list[tuple[str, str]] = []  # (form, marker), longest form first

    def register(self, name: str, value: str | bytes | None) -> None:
        """Register `value` under `name`; None or empty registers nothing. Surrounding
        whitespace (a file's trailing newline) is not part of the credential."""
        if value is None:
            return
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        text = text.strip()
        if not text:
            return
        if len(text) < MIN_SECRET_LENGTH:
            raise SecretTooShort(
                f"the credential {name!r} is {len(text)} characters long; at least "
                f"{MIN_SECRET_LENGTH} are needed so that it can be redacted"
            )
        with self._lock:
            self._values[f"{name}#{len(self._values)}"] = text
            self._rebuild()

    def _rebuild(self) -> None:
        forms: list[tuple[str, str]] = []
        for key, value in self._values.items():
            marker = MARKER.format(name=key.split("#", 1)[0])
            for form in encodings(value):
                forms.append((form, marker))
        forms.sort(key=lambda pair: len(pair[0]), reverse=True)
        self._forms = forms

    def values(self) -> list[str]:
        with self._lock:
            return list(self._values.values())

    def redact(self, text: str) -> str:
        forms = self._forms
        for form, marker in forms:
            if form in text:
                text = text.replace(form, marker)
        return text


def encodings(value: str) -> list[str]:
    """The forms in which `value` may appear in a text. The registry's redactor extends this."""
    return [value]


registry = SecretRegistry()


def register(name: str, value: str | bytes | None) -> None:
    registry.register(name, value)


def redact(text: str) -> str:
    """`text` with every registered credential (in every known form) replaced by a marker."""
    return registry.redact(text)
