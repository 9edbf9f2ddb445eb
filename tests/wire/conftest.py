from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_dev.scripted import ScriptedModel, serve_in_thread
from tests._fixtures import postgres, scripted, scripted_server  # noqa: F401

from ._rig import Harness, MenuStandIn, Model, new_conversation, serve


@pytest.fixture(scope="session")
def model() -> Iterator[Model]:
    running = serve_in_thread(ScriptedModel())
    yield Model(running.model, running.url)
    running.stop()


@pytest.fixture(scope="session")
def menu() -> Iterator[tuple[MenuStandIn, str]]:
    stand_in = MenuStandIn()
    url, server = serve(stand_in.app)
    yield stand_in, url
    server.should_exit = True


def _make(tmp: Path, model: Model, menu_url: str | None, **kw: object) -> Harness:
    (tmp / "state").mkdir(parents=True)
    (tmp / "root").mkdir()
    return Harness(model.url, menu_url, tmp / "state", tmp / "root", **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def harness(
    tmp_path_factory: pytest.TempPathFactory, model: Model, menu: tuple[MenuStandIn, str]
) -> Iterator[Harness]:
    """The shared harness process: one per test session, conversations keep tests apart."""
    proc = _make(tmp_path_factory.mktemp("harness"), model, menu[1])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_harness(tmp_path: Path, model: Model, menu: tuple[MenuStandIn, str]) -> Iterator[Harness]:
    """A harness of the test's own (for restarts and special settings); started by the test."""
    proc = _make(tmp_path, model, menu[1])
    yield proc
    proc.stop()


@pytest.fixture
def conv() -> str:
    return new_conversation()
