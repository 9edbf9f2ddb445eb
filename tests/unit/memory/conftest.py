"""Both memory backends for one conformance suite: a SQLite file, and a real PostgreSQL server
started once for the test session (tests/_postgres.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral_common.memory import MemoryBackend, PostgresBackend, SqliteBackend

OpenBackend = Callable[[], MemoryBackend]


@pytest.fixture(params=["sqlite", "postgres"])
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenBackend]:
    """Opens a backend on one shared store (each call a new connection, as two custodians
    would have); every test works in scopes of its own."""
    opened: list[MemoryBackend] = []
    if request.param == "sqlite":
        path = tmp_path / "memory.db"

        def open_one() -> MemoryBackend:
            opened.append(SqliteBackend(path))
            return opened[-1]
    else:
        dsn = request.getfixturevalue("postgres").dsn

        def open_one() -> MemoryBackend:
            opened.append(PostgresBackend(dsn))
            return opened[-1]

    yield open_one
    for backend in opened:
        backend.close()


@pytest.fixture
def scope() -> str:
    """A scope no other test uses (the PostgreSQL server is shared by the session)."""
    return f"ns-{uuid.uuid4().hex[:8]}/agent"
