"""The one place that chooses the engine adapter: CORRAL_ENGINE, `lean` unless set.

- `lean` (default): `lean_engine`, the Messages API over httpx; quick to load.
- `sdk`: `anthropic_engine`, the official SDK (the reference adapter). Its import is slow (ADR
  0014 has the figures), so it is loaded in a thread once the server listens, and `/readyz`
  answers 503 until it is in.

Both are held to the same conformance tests (tests/unit/harness/test_engine_adapter.py and
tests/wire/test_engine.py run over each).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import HarnessConfig
from ._loop import EngineSettings
from .seam import EngineAdapter

_MODULES = {
    "lean": ("corral_harness.engine.lean_engine", "LeanEngine"),
    "sdk": ("corral_harness.engine.anthropic_engine", "AnthropicEngine"),
}


def engine_module(engine: str) -> str:
    """The module that holds the adapter CORRAL_ENGINE names (for preloading it)."""
    return _MODULES[engine][0]


def engine_loader(config: HarnessConfig) -> Callable[[], Awaitable[EngineAdapter]]:
    """Load the chosen adapter once (the SDK in a thread) and hand out engines built from config."""
    module_name, class_name = _MODULES[config.engine]
    loaded: asyncio.Future[EngineAdapter] | None = None

    settings = EngineSettings(
        base_url=config.model_base_url,
        retries=config.model_retries,
        backoff_seconds=config.retry_backoff_seconds,
        idle_seconds=config.stream_idle_seconds,
        stream_cap_seconds=config.stream_cap_seconds,
        cache_breakpoints=config.cache_breakpoints,
        **({"api_key": credential} if (credential := config.custodian_credential()) else {}),
    )

    def _engine_class() -> Any:
        return getattr(importlib.import_module(module_name), class_name)

    def _import() -> EngineAdapter:
        engine_class = _engine_class()

        def make() -> Any:
            return engine_class(settings)

        return make

    def _prepare() -> None:
        _engine_class().prepare(settings)

    async def get() -> EngineAdapter:
        nonlocal loaded
        if loaded is None:
            if config.engine == "sdk":
                loaded = asyncio.ensure_future(asyncio.to_thread(_import))
            else:
                loaded = asyncio.get_running_loop().create_future()
                try:
                    make = _import()
                    _prepare()  # in the loop, where the adapter's connection pool lives
                    loaded.set_result(make)
                except Exception as exc:  # surfaced to every caller, as the thread's would be
                    loaded.set_exception(exc)
        return await loaded

    return get
