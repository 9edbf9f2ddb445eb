"""What a model request may ask for, as pure functions over its bytes, its headers and the facts.

The caller is not trusted: it may name any model, any max_tokens, server-side tools that reach
the network from the provider's side (past the pod's egress policy), an MCP connector, content
the provider fetches by URL or file id, or a body the custodian would read one way and the
provider another (a key given twice: a JSON parser keeps either). So the body is parsed
refusing a duplicate key anywhere (`parse_body`); its shape is held to an allowlist of the
Messages API (`check_shape`: the top-level fields, the block types and each one's fields,
`cache_control` included), anything else refused naming its path; and what goes upstream is
always the custodian's own serialisation of the checked object (`encode_body`), never the
caller's bytes. The custodian lets through only the Agent's model and the Session's
override, clamps max_tokens to min(the Agent's limits.maxOutputTokens, the catalog's maximum
for the model), keeps a thinking budget below it, and refuses the rest with a reason the model
can read. Of the request's headers only `anthropic-version` and `anthropic-beta` (with the
betas listed here) go upstream (`forwarded_headers`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .facts import SessionFacts
from .prices import price_for

MIN_THINKING_BUDGET = 1024
_INVALID = "invalid_request_error"


@dataclass(frozen=True)
class ModelRefusal:
    status: int
    kind: str  # the Anthropic error type
    message: str


@dataclass(frozen=True)
class CheckedRequest:
    body: dict[str, Any]
    model: str
    max_tokens: int


def _bad(message: str) -> ModelRefusal:
    return ModelRefusal(400, _INVALID, message)


# ------------------------------------------------------------------------------ the body


class _Duplicated(dict[str, Any]):
    """An object in which a key came twice; `key` names it."""

    key = ""


def _marked(made: dict[str, Any], pairs: list[tuple[str, Any]]) -> _Duplicated:
    marked = _Duplicated(made)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.key = key
            break
        seen.add(key)
    return marked


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _duplicate_path(root: Any) -> str:
    """Where the first duplicated key is, as `messages[0].content[1].input.command`."""
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _Duplicated):
            return f"{path}.{value.key}" if path else value.key
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else k) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(value))))
    return "?"


def parse_body(raw: bytes) -> dict[str, Any] | ModelRefusal:
    """The request as an object, refusing what is not one JSON object with each key once."""
    duplicated = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal duplicated
        made = dict(items)
        if len(made) == len(items):
            return made
        duplicated = True
        return _marked(made, items)

    try:
        body = json.loads(raw, object_pairs_hook=pairs, parse_constant=_no_constant)
    except RecursionError:
        return _bad("the body is nested too deeply")
    except ValueError as e:
        return _bad(f"the body is not JSON: {e}")
    if not isinstance(body, dict):
        return _bad("the body must be an object")
    if duplicated:  # only then is the body walked, for where it is
        return _bad(
            f"the key {_duplicate_path(body)!r} appears more than once in its object; "
            "each key may be given once"
        )
    return body


def encode_body(body: dict[str, Any]) -> bytes:
    """The bytes that go upstream: json.dumps of the checked object, so the provider reads
    exactly what was checked (and the lean engine's own requests come out byte for byte)."""
    return json.dumps(body).encode()


# -------------------------------------------------------------------------- the allowlist


class _Refused:
    """Why a value is refused; `{at}` in the text stands for its path, which is put together
    only on the way out, so a request that passes builds no path strings."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts: list[str] = []  # innermost first

    def within(self, part: str) -> _Refused:
        self.parts.append(part)
        return self

    def message(self) -> str:
        path = ""
        for part in reversed(self.parts):
            path += part if part.startswith("[") or not path else "." + part
        return self.text.replace("{at}", repr(path))


Check = Callable[[Any], _Refused | None]


def _string(value: Any) -> _Refused | None:
    return None if isinstance(value, str) else _Refused("{at} must be a string")


def _boolean(value: Any) -> _Refused | None:
    return None if isinstance(value, bool) else _Refused("{at} must be true or false")


def _number(value: Any) -> _Refused | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return None if ok else _Refused("{at} must be a number")


def _integer(value: Any) -> _Refused | None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return None if ok else _Refused("{at} must be an integer")


def _any_object(value: Any) -> _Refused | None:
    # Free-form JSON (a tool's input, its schema): the provider acts on none of it.
    return None if isinstance(value, dict) else _Refused("{at} must be an object")


def _one_of(*allowed: str) -> Check:
    listed = ", ".join(repr(a) for a in allowed)

    def check(value: Any) -> _Refused | None:
        if value in allowed:
            return None
        return _Refused(f"{{at}} is {_shown(value)}; allowed: {listed}")

    return check


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fields(
    value: Any, allowed: dict[str, Check], required: tuple[str, ...] = ()
) -> _Refused | None:
    """An object with only the `allowed` fields, each passing its check."""
    if not isinstance(value, dict):
        return _Refused("{at} must be an object")
    for name, item in value.items():
        check = allowed.get(name)
        if check is None:
            listed = ", ".join(sorted(allowed))
            return _Refused(
                f"{{at}} is not allowed through the custodian (allowed here: {listed})"
            ).within(name)
        problem = check(item)
        if problem is not None:
            return problem.within(name)
    for name in required:
        if name not in value:
            return _Refused("{at} is required").within(name)
    return None


def _object(allowed: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    return lambda value: _fields(value, allowed, required)


def _list_of(item: Check) -> Check:
    def check(value: Any) -> _Refused | None:
        if not isinstance(value, list):
            return _Refused("{at} must be a list")
        for i, element in enumerate(value):
            problem = item(element)
            if problem is not None:
                return problem.within(f"[{i}]")
        return None

    return check


# A 1-hour cache write costs more than the catalog's cache-write price counts; only the
# default 5-minute cache is allowed, so the budget prices what is spent.
_cache_control = _object({"type": _one_of("ephemeral"), "ttl": _one_of("5m")}, ("type",))


def _source(*kinds: str) -> Check:
    """A block's source: inline data only. A `url` or `file` source would have the provider
    fetch content the custodian never saw (and whose size no reservation counted)."""
    inline = _object({"type": _string, "media_type": _string, "data": _string}, ("type",))
    listed = " or ".join(repr(k) for k in kinds)

    def check(value: Any) -> _Refused | None:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in kinds:
            return _Refused(
                f"{{at}} is {_shown(kind)}: only {listed} sources are allowed (the custodian "
                "forwards inline content only, never a URL or file the provider would fetch)"
            ).within("type")
        return inline(value)

    return check


def _nullable(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


# A citation of a document the request itself carried (`citations.enabled` on a document
# block): the model's answer holds them and the next request sends them back. Citations of
# search results or the web come from server tools, which stay refused.
_CITATION_FIELDS: dict[str, Check] = {
    "type": _one_of("char_location", "page_location", "content_block_location"),
    "cited_text": _string,
    "document_index": _integer,
    "document_title": _nullable(_string),
    "file_id": _nullable(_string),
    "start_char_index": _integer,
    "end_char_index": _integer,
    "start_page_number": _integer,
    "end_page_number": _integer,
    "start_block_index": _integer,
    "end_block_index": _integer,
}
_citations = _list_of(_object(_CITATION_FIELDS, ("type", "cited_text", "document_index")))
_TEXT = {"type": _string, "text": _string, "cache_control": _cache_control}
_ANSWER_TEXT = {**_TEXT, "citations": _nullable(_citations)}
_IMAGE = {"type": _string, "source": _source("base64"), "cache_control": _cache_control}
_DOCUMENT = {
    "type": _string,
    "source": _source("base64", "text"),
    "title": _string,
    "context": _string,
    "citations": _object({"enabled": _boolean}),
    "cache_control": _cache_control,
}
Blocks = dict[str, tuple[dict[str, Check], tuple[str, ...]]]


def _blocks(types: Blocks) -> Check:
    """A string, or a list of blocks of the named types, each with only its fields."""
    listed = ", ".join(repr(t) for t in types)

    def block(value: Any) -> _Refused | None:
        kind = value.get("type") if isinstance(value, dict) else None
        spec = types.get(kind) if isinstance(kind, str) else None
        if spec is None:
            return _Refused(
                f"{{at}} is {_shown(kind)}: the block types allowed here are {listed}"
            ).within("type")
        return _fields(value, spec[0], spec[1])

    items = _list_of(block)

    def check(value: Any) -> _Refused | None:
        return None if isinstance(value, str) else items(value)

    return check


_RESULT_BLOCKS: Blocks = {
    "text": (_TEXT, ("text",)),
    "image": (_IMAGE, ("source",)),
    "document": (_DOCUMENT, ("source",)),
}
_MESSAGE_BLOCKS: Blocks = {
    **_RESULT_BLOCKS,
    "text": (_ANSWER_TEXT, ("text",)),
    "tool_use": (
        {"type": _string, "id": _string, "name": _string, "input": _any_object,
         "cache_control": _cache_control},
        ("id", "name", "input"),
    ),
    "tool_result": (
        {"type": _string, "tool_use_id": _string, "content": _blocks(_RESULT_BLOCKS),
         "is_error": _boolean, "cache_control": _cache_control},
        ("tool_use_id",),
    ),
    "thinking": ({"type": _string, "thinking": _string, "signature": _string}, ("thinking",)),
    "redacted_thinking": ({"type": _string, "data": _string}, ("data",)),
}  # fmt: skip
_TOOL_FIELDS: dict[str, Check] = {
    "type": _string, "name": _string, "description": _string, "input_schema": _any_object,
    "cache_control": _cache_control,
}  # fmt: skip


def _tool(value: Any) -> _Refused | None:
    kind = value.get("type", "custom") if isinstance(value, dict) else None
    if kind not in (None, "custom"):
        return _Refused(
            f"server tool {_shown(kind)} is not allowed: only tools the harness runs may be "
            "offered to the model"
        )
    return _fields(value, _TOOL_FIELDS, ("name", "input_schema"))


def _thinking(value: Any) -> _Refused | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "enabled":
        return _fields(value, {"type": _string, "budget_tokens": _integer}, ("budget_tokens",))
    if kind == "disabled":
        return _fields(value, {"type": _string})
    return _Refused(f"{{at}} is {_shown(kind)}; allowed: 'enabled', 'disabled'").within("type")


_TOP_LEVEL: dict[str, Check] = {
    "model": _string,
    "messages": _list_of(
        _object({"role": _one_of("user", "assistant"), "content": _blocks(_MESSAGE_BLOCKS)},
                ("role", "content"))
    ),
    "max_tokens": _integer,
    "system": _blocks({"text": (_TEXT, ("text",))}),
    "metadata": _object({"user_id": _string}),
    "stop_sequences": _list_of(_string),
    "stream": _boolean,
    "temperature": _number,
    "top_p": _number,
    "top_k": _integer,
    "tools": _list_of(_tool),
    "tool_choice": _object(
        {"type": _one_of("auto", "any", "tool", "none"), "name": _string,
         "disable_parallel_tool_use": _boolean},
        ("type",),
    ),
    "thinking": _thinking,
}  # fmt: skip


def check_shape(body: dict[str, Any]) -> ModelRefusal | None:
    """Every field, block and block field of the request is one the allowlist names."""
    problem = _fields(body, _TOP_LEVEL)
    return None if problem is None else _bad(problem.message())


# ---------------------------------------------------------------------------- the headers

# Betas that change neither what the provider may reach nor what a token costs. Any other
# beta is refused: betas widen what a request may make the provider do (a connector, code
# execution, files, a longer and dearer context window) beyond what is checked here.
ALLOWED_BETAS = frozenset(
    {"interleaved-thinking-2025-05-14", "fine-grained-tool-streaming-2025-05-14"}
)
_API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")


def forwarded_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str] | ModelRefusal:
    """The caller's headers that go upstream: `anthropic-version` and the allowed betas.

    Only `anthropic-*` headers carry meaning to the provider, so an unknown one is refused
    (it could be an API switch this check knows nothing of); every other header (content
    type and length, user agent, the SDK's `x-stainless-*`, the caller's credential) is
    simply not forwarded: it means nothing upstream, and refusing it would refuse every
    ordinary client.
    """
    out: dict[str, str] = {}
    for raw_name, value in pairs:
        name = raw_name.lower()
        if not name.startswith("anthropic-"):
            continue
        if name not in ("anthropic-version", "anthropic-beta"):
            return _bad(
                f"header {name!r} is not allowed through the custodian (allowed: "
                "anthropic-version, anthropic-beta)"
            )
        if name in out:
            return _bad(f"header {name!r} is given more than once")
        value = value.strip()
        if name == "anthropic-version" and not _API_VERSION.fullmatch(value):
            return _bad(f"header 'anthropic-version' must be a date (YYYY-MM-DD), not {value!r}")
        if name == "anthropic-beta":
            betas = [b.strip() for b in value.split(",") if b.strip()]
            refused = [b for b in betas if b not in ALLOWED_BETAS]
            if refused:
                return _bad(
                    f"beta {refused[0]!r} (header 'anthropic-beta') is not allowed through the "
                    "custodian; allowed: " + ", ".join(sorted(ALLOWED_BETAS))
                )
            value = ",".join(betas)
        out[name] = value
    return out


# ---------------------------------------------------------------------------- the rules


def output_limit(facts: SessionFacts, model: str) -> int:
    """min(the Agent's maxOutputTokens (itself under the hard cap), the catalog's maximum)."""
    info = price_for(model)
    limit = facts.max_output_tokens
    return min(limit, info.max_output_tokens) if info is not None else limit


def check_request(facts: SessionFacts, body: dict[str, Any]) -> CheckedRequest | ModelRefusal:
    """The request as it may go upstream (clamped), or why it may not."""
    shape = check_shape(body)
    if shape is not None:
        return shape
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _bad("'model' must name a model")
    allowed = facts.allowed_models
    if model not in allowed:
        return ModelRefusal(
            403,
            "permission_error",
            f"model {model!r} is not allowed for this session; allowed: "
            + ", ".join(repr(m) for m in allowed)
            + " (the Agent's model and the Session's spec.overrides.model)",
        )
    if facts.budget.cost is not None and price_for(model) is None:
        return _bad(
            f"model {model!r} has no price in the catalog, so it cannot be held to this "
            "session's cost budget"
        )
    requested = body.get("max_tokens")
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        return _bad("'max_tokens' must be a positive integer")
    limit = output_limit(facts, model)
    if requested <= limit:
        return CheckedRequest(body, model, requested)
    clamped = dict(body, max_tokens=limit)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget >= limit:
            # The provider needs budget_tokens < max_tokens, and at least 1024 of it.
            if limit - 1 >= MIN_THINKING_BUDGET:
                clamped["thinking"] = dict(thinking, budget_tokens=limit - 1)
            else:
                clamped["thinking"] = {"type": "disabled"}
    return CheckedRequest(clamped, model, limit)
