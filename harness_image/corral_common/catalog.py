"""The model catalog: context windows, output maxima, thinking support and prices, as data.

The catalog ships as `models.json` beside this module. A platform team extends or overrides it
without a release: `CORRAL_MODEL_CATALOG` names an overlay file (JSON, or YAML) whose `models`
entries are merged over the shipped ones by name (a known name: only the fields given change; a
new name: every field is required). The chart renders that file into a ConfigMap the operator
mounts into the harness and custodian containers (docs/model-catalog.md).

Loaded once, on first use, with the standard library and pydantic only (both already imported by
every caller), so the harness's start path pays nothing for it. Prices are US dollars per million
tokens; `corral-scripted` is the project's scripted demo model and costs nothing.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral_api.kinds import MAX_OUTPUT_TOKENS_CAP, ThinkingLevel

CATALOG_ENV = "CORRAL_MODEL_CATALOG"
SHIPPED_CATALOG = Path(__file__).with_name("models.json")

# Thinking budget (tokens) sent with every generation, per level.
THINKING_BUDGETS: dict[str, int] = {"low": 1024, "medium": 4096, "high": 16000}

# What a model id may look like: the Messages API's ids, dated ids and platform-specific ones.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    context_window: int
    max_output_tokens: int
    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float
    cache_write_per_mtok: float
    thinking: bool = True
    # The model's id at each cloud provider (`bedrock`, `vertex`), where it differs from the
    # Messages API's name (docs/providers.md).
    provider_ids: tuple[tuple[str, str], ...] = ()

    def id_for(self, provider_type: str) -> str | None:
        """The id a `provider_type` provider knows this model by; None when the catalog
        gives none (an `anthropic` or `gateway` provider uses the name itself)."""
        return dict(self.provider_ids).get(provider_type)


class CatalogError(ValueError):
    """The shipped catalog or the overlay cannot be read or is not valid; the message says where."""


class UnknownModel(ValueError):
    pass


# ------------------------------------------------------------------------------ the file format


class _FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Prices(_FileModel):
    input: float = Field(ge=0, description="USD per million input tokens.")
    output: float = Field(ge=0, description="USD per million output tokens.")
    cacheRead: float = Field(ge=0, description="USD per million cache-read tokens.")
    cacheWrite: float = Field(ge=0, description="USD per million cache-write tokens.")


class CatalogEntry(_FileModel):
    name: str = Field(pattern=MODEL_NAME_PATTERN)
    contextWindow: int = Field(ge=1024, le=100_000_000)
    maxOutputTokens: int = Field(ge=1, le=10_000_000)
    thinking: bool = True
    prices: Prices
    aliases: list[str] = Field(default_factory=list, description="Other ids of the same model.")
    providers: dict[Literal["bedrock", "vertex"], str] = Field(
        default_factory=dict,
        description="The model's id at each cloud (Bedrock's without the region's prefix).",
    )


class CatalogFile(_FileModel):
    comment: str | None = Field(default=None, alias="_comment")
    models: list[dict[str, Any]] = Field(default_factory=list)


def _where(err: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(top level)"


def _invalid(source: str, exc: ValidationError, prefix: str = "") -> CatalogError:
    parts = [f"{prefix}{_where(e)}: {e['msg']}" for e in exc.errors()[:5]]
    return CatalogError(f"model catalog {source}: " + "; ".join(parts))


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CatalogError(f"model catalog {path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as json_error:
        if path.suffix not in (".yaml", ".yml"):
            raise CatalogError(
                f"model catalog {path}: not valid JSON: {json_error.msg} at line "
                f"{json_error.lineno} column {json_error.colno}"
            ) from json_error
    import yaml  # only for a hand-written YAML overlay; the chart renders JSON

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as yaml_error:
        raise CatalogError(f"model catalog {path}: not valid YAML: {yaml_error}") from yaml_error


def _entries(path: Path) -> list[dict[str, Any]]:
    data = _read(path)
    if data is None:
        return []  # an empty overlay file adds nothing
    try:
        return CatalogFile.model_validate(data).models
    except ValidationError as exc:
        raise _invalid(str(path), exc) from exc


def merge_entries(
    shipped: list[dict[str, Any]], overlay: list[dict[str, Any]], source: str = "overlay"
) -> list[CatalogEntry]:
    """The overlay's entries over the shipped ones, by name; each result validated."""
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    for where, entries in (("shipped", shipped), (source, overlay)):
        for index, raw in enumerate(entries):
            name = raw.get("name") if isinstance(raw, dict) else None
            if not isinstance(name, str) or not name:
                raise CatalogError(f"model catalog {where}: models[{index}]: needs a 'name'")
            base = merged.get(name, {})
            combined = {**base, **raw}
            if isinstance(base.get("prices"), dict) and isinstance(raw.get("prices"), dict):
                combined["prices"] = {**base["prices"], **raw["prices"]}
            merged[name] = combined
            origin[name] = f"{where}: models[{index}] ({name})"
    out: list[CatalogEntry] = []
    for name, raw in merged.items():
        try:
            out.append(CatalogEntry.model_validate(raw))
        except ValidationError as exc:
            raise _invalid(origin[name], exc, prefix="") from exc
    return out


def catalog_from(entries: list[CatalogEntry]) -> dict[str, ModelInfo]:
    """One `ModelInfo` per name and per alias (an alias keeps its own name: it is what the
    request and the custodian's allowlist carry)."""
    models: dict[str, ModelInfo] = {}
    for entry in entries:
        p = entry.prices
        for name in (entry.name, *entry.aliases):
            models[name] = ModelInfo(
                name,
                entry.contextWindow,
                entry.maxOutputTokens,
                p.input,
                p.output,
                p.cacheRead,
                p.cacheWrite,
                thinking=entry.thinking,
                provider_ids=tuple(sorted(entry.providers.items())),
            )
    return models


def load_catalog(
    overlay: Path | None = None, shipped: Path = SHIPPED_CATALOG
) -> dict[str, ModelInfo]:
    """The shipped catalog with `overlay` merged over it; `CatalogError` names what is wrong."""
    extra = _entries(overlay) if overlay is not None else []
    return catalog_from(merge_entries(_entries(shipped), extra, str(overlay)))


@functools.cache
def models() -> dict[str, ModelInfo]:
    """The catalog this process uses: the shipped file and `$CORRAL_MODEL_CATALOG`, read once."""
    overlay = os.environ.get(CATALOG_ENV, "").strip()
    return load_catalog(Path(overlay) if overlay else None)


def check_catalog() -> int:
    """Load the catalog now (a process's start), so a bad overlay stops it with a clear message
    instead of failing its first request; returns the number of model names."""
    return len(models())


def resolve_model(name: str) -> ModelInfo:
    """The catalog entry for `name`, or `UnknownModel` with the names that exist."""
    known = models()
    info = known.get(name)
    if info is None:
        raise UnknownModel(f"unknown model {name!r}; known models: {', '.join(sorted(known))}")
    return info


def window_of(name: str) -> int | None:
    """The registered context window, or None for a model the catalog does not know."""
    info = models().get(name)
    return info.context_window if info is not None else None


def clamp_output_tokens(info: ModelInfo, requested: int | None) -> int:
    """min(the call's request, the model's maximum, the soft cap); a call cannot raise the cap."""
    limit = min(info.max_output_tokens, MAX_OUTPUT_TOKENS_CAP)
    return limit if requested is None else max(1, min(requested, limit))


def thinking_param(info: ModelInfo, level: ThinkingLevel, max_tokens: int) -> dict[str, Any]:
    """The `thinking` request field for a level. The budget stays below max_tokens."""
    if not info.thinking or max_tokens <= 1024:
        return {"type": "disabled"}
    return {"type": "enabled", "budget_tokens": min(THINKING_BUDGETS[level], max_tokens - 1)}


def cost_usd(
    info: ModelInfo, *, input: int, output: int, cache_read: int = 0, cache_write: int = 0
) -> float:
    total = (
        input * info.input_per_mtok
        + output * info.output_per_mtok
        + cache_read * info.cache_read_per_mtok
        + cache_write * info.cache_write_per_mtok
    ) / 1_000_000
    return round(total, 10)
