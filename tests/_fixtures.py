"""Fixtures more than one tier uses, defined once. The conftest.py of each directory whose tests
use one imports it (`from tests._fixtures import scripted  # noqa: F401`): a test module that
imported it would shadow it with its tests' arguments."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._postgres import Postgres, running_postgres
from tests._scripted import ScriptedServer, serving_scripted


@pytest.fixture(scope="session")
def scripted_server() -> Iterator[ScriptedServer]:
    """One scripted model server per test session (and xdist worker): a start and stop take
    ~0.2 s, and session scope keeps the modules that use it out of the module groups of
    tests/conftest.py. Tests take it through `scripted`."""
    with serving_scripted() as server:
        yield server


@pytest.fixture
def scripted(scripted_server: ScriptedServer) -> ScriptedServer:
    """The scripted model server for this test, as new: no script, no requests (a test's
    clients are done when it ends, so nothing of one test reaches the next)."""
    scripted_server.reset()
    return scripted_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server (tests/_postgres.py), one per test session (and xdist worker):
    the tests that share it keep apart by memory scope."""
    with running_postgres() as server:
        yield server
