"""Choosing the engine, and /readyz waiting for the engine (the lean adapter's stream reader is
held to the event-stream table in tests/unit/common/test_sse.py).

The SDK must not be imported on the default (lean) path: that import is what kept the first
model request seconds after process start (docs/performance.md, "First model request").
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from corral_harness.config import HarnessConfig
from corral_harness.engine import lean_engine
from corral_harness.engine.choice import engine_loader
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.seam import EngineAdapter
from corral_harness.server import create_app

pytestmark = pytest.mark.timeout(60)


def test_the_default_engine_is_lean_and_sdk_is_chosen_by_env(tmp_path: Path) -> None:
    config = HarnessConfig.from_env({"CORRAL_GRANTED_ROOT": str(tmp_path)})
    assert config.engine == "lean"
    chosen = HarnessConfig.from_env({"CORRAL_GRANTED_ROOT": str(tmp_path), "CORRAL_ENGINE": "sdk"})
    assert chosen.engine == "sdk"

    async def build() -> tuple[object, bool]:
        engine = (await engine_loader(config)())()
        # The connection pool (and its TLS context) was made at load, not by the first request.
        pooled = any(key[0] == id(asyncio.get_running_loop()) for key in lean_engine._clients)
        return engine, pooled

    engine, pooled = asyncio.run(build())
    assert isinstance(engine, LeanEngine) and pooled


def test_the_lean_path_from_start_to_a_built_engine_never_imports_the_sdk(tmp_path: Path) -> None:
    """The harness's whole start path (its main module, the app, the engine load) in a fresh
    interpreter: `anthropic` stays out of sys.modules unless CORRAL_ENGINE=sdk."""
    program = f"""
import asyncio, os, sys
os.environ["CORRAL_GRANTED_ROOT"] = {str(tmp_path)!r}
os.environ["CORRAL_STATE_DIR"] = {str(tmp_path / "state")!r}
import corral_harness.main as main
from corral_harness.config import HarnessConfig
from corral_harness.engine.choice import engine_loader
config = HarnessConfig.from_env()
main.create_app(config, policy=main.build_policy(config))
engine = asyncio.run(engine_loader(config)())()
print(type(engine).__name__, "anthropic" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["LeanEngine", "False"]


def _app_with(loader: object, tmp_path: Path) -> TestClient:
    config = HarnessConfig(state_dir=tmp_path / "state", granted_root=tmp_path)
    return TestClient(create_app(config, engine=loader))  # type: ignore[arg-type]


def test_readyz_says_ready_only_once_the_engine_is_loaded(tmp_path: Path) -> None:
    async def slow() -> EngineAdapter:
        await asyncio.sleep(0.8)
        return lambda: LeanEngine.__new__(LeanEngine)

    with _app_with(slow, tmp_path) as client:
        first = client.get("/readyz")
        assert first.status_code == 503
        assert first.json() == {"ready": False, "reason": "the model engine"}
        deadline = time.monotonic() + 10
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.05)
        assert client.get("/readyz").json() == {"ready": True}


def test_readyz_names_an_engine_that_failed_to_load(tmp_path: Path) -> None:
    async def broken() -> EngineAdapter:
        raise ImportError("no module named 'anthropic'")

    with _app_with(broken, tmp_path) as client:
        deadline = time.monotonic() + 10
        while (answer := client.get("/readyz")).json()["reason"] == "the model engine":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert answer.status_code == 503
        assert "failed to load: no module named 'anthropic'" in answer.json()["reason"]
