"""Where facts are kept: one SQLite file (`corral run`, tests) or a PostgreSQL database (a
cluster). A backend stores rows and answers by scope; it never ranks, so recall means the same
on both (the ranking is `MemoryStore`'s). psycopg is imported only when a PostgreSQL backend is
opened, so a custodian without one never loads it.
"""

from __future__ import annotations

import importlib
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class MemoryUnavailable(RuntimeError):
    """The store cannot be reached or opened (not the caller's fault)."""


@dataclass(frozen=True)
class Origin:
    """Where a fact was written: the Session and its turn (a number in a cluster, the
    submission id where no turn count is known)."""

    session: str = ""
    turn: str = ""

    def phrase(self) -> str:
        if not self.session:
            return "origin unknown"
        return f"from session {self.session} turn {self.turn or '?'}"


@dataclass(frozen=True)
class Row:
    id: int
    subject: str
    subject_key: str
    text: str
    embedder: str
    embedding: bytes
    origin: Origin


class MemoryBackend(Protocol):
    """Row storage, every call confined to one scope."""

    def insert(
        self,
        scope: str,
        subject: str,
        key: str,
        text: str,
        embedder: str,
        embedding: bytes,
        origin: Origin,
        now: float,
    ) -> int: ...

    def update(
        self,
        scope: str,
        fact_id: int,
        text: str,
        embedder: str,
        embedding: bytes,
        origin: Origin,
        now: float,
    ) -> bool: ...

    def delete(self, scope: str, fact_id: int) -> bool: ...

    def link(self, scope: str, a: str, b: str) -> None: ...

    def rows(self, scope: str) -> list[Row]: ...

    def links(self, scope: str) -> list[tuple[str, str]]: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------------------------ SQLite

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    subject TEXT NOT NULL,
    subject_key TEXT NOT NULL,
    text TEXT NOT NULL,
    embedder TEXT NOT NULL,
    embedding BLOB NOT NULL,
    updated REAL NOT NULL,
    origin_session TEXT NOT NULL DEFAULT '',
    origin_turn TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS facts_scope_subject ON facts (scope, subject_key);
CREATE TABLE IF NOT EXISTS links (
    scope TEXT NOT NULL,
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    PRIMARY KEY (scope, a, b)
);
"""

_ROW_COLUMNS = "id, subject, subject_key, text, embedder, embedding, origin_session, origin_turn"


def _row(values: tuple[Any, ...]) -> Row:
    fid, subject, key, text, embedder, blob, session, turn = values
    return Row(int(fid), subject, key, text, embedder, bytes(blob), Origin(session, turn))


class SqliteBackend:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Callers may come from worker threads; one lock keeps each statement whole.
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        with self._lock:
            # WAL: readers do not wait for a writer (two runs may share the file), and a
            # commit is one append instead of a journal rewrite.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SQLITE_SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(facts)")}
            # A file from before facts kept their origin: add the columns, keep the facts.
            for column in ("origin_session", "origin_turn"):
                if column not in columns:
                    self._db.execute(
                        f"ALTER TABLE facts ADD COLUMN {column} TEXT NOT NULL DEFAULT ''"
                    )
            self._db.commit()

    def insert(
        self,
        scope: str,
        subject: str,
        key: str,
        text: str,
        embedder: str,
        embedding: bytes,
        origin: Origin,
        now: float,
    ) -> int:
        with self._lock, self._db:
            cur = self._db.execute(
                "INSERT INTO facts (scope, subject, subject_key, text, embedder, embedding,"
                " updated, origin_session, origin_turn) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (scope, subject, key, text, embedder, embedding, now, origin.session, origin.turn),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def update(
        self,
        scope: str,
        fact_id: int,
        text: str,
        embedder: str,
        embedding: bytes,
        origin: Origin,
        now: float,
    ) -> bool:
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE facts SET text = ?, embedder = ?, embedding = ?, updated = ?,"
                " origin_session = ?, origin_turn = ? WHERE id = ? AND scope = ?",
                (text, embedder, embedding, now, origin.session, origin.turn, fact_id, scope),
            )
        return cur.rowcount > 0

    def delete(self, scope: str, fact_id: int) -> bool:
        with self._lock, self._db:
            cur = self._db.execute("DELETE FROM facts WHERE id = ? AND scope = ?", (fact_id, scope))
        return cur.rowcount > 0

    def link(self, scope: str, a: str, b: str) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO links (scope, a, b) VALUES (?, ?, ?)", (scope, a, b)
            )

    def rows(self, scope: str) -> list[Row]:
        with self._lock:
            found = self._db.execute(
                f"SELECT {_ROW_COLUMNS} FROM facts WHERE scope = ? ORDER BY id", (scope,)
            ).fetchall()
        return [_row(r) for r in found]

    def links(self, scope: str) -> list[tuple[str, str]]:
        with self._lock:
            found = self._db.execute(
                "SELECT a, b FROM links WHERE scope = ? ORDER BY a, b", (scope,)
            ).fetchall()
        return [(a, b) for a, b in found]

    def close(self) -> None:
        with self._lock:
            self._db.close()


# -------------------------------------------------------------------------------- PostgreSQL

_PG_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS corral_memory_facts (
        id BIGSERIAL PRIMARY KEY,
        scope TEXT NOT NULL,
        subject TEXT NOT NULL,
        subject_key TEXT NOT NULL,
        text TEXT NOT NULL,
        embedder TEXT NOT NULL,
        embedding BYTEA NOT NULL,
        updated DOUBLE PRECISION NOT NULL,
        origin_session TEXT NOT NULL DEFAULT '',
        origin_turn TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX IF NOT EXISTS corral_memory_facts_scope_subject"
    " ON corral_memory_facts (scope, subject_key)",
    """CREATE TABLE IF NOT EXISTS corral_memory_links (
        scope TEXT NOT NULL,
        a TEXT NOT NULL,
        b TEXT NOT NULL,
        PRIMARY KEY (scope, a, b)
    )""",
)
# Two custodians starting at once would race on CREATE TABLE IF NOT EXISTS; this lock orders
# them (any constant key; this one spells "corral-mem").
_SCHEMA_LOCK_KEY = 0x636F7272616C6D


class PostgresBackend:
    """One connection, reopened once when it broke; statements run one at a time."""

    def __init__(self, dsn: str, *, connect_timeout: int = 5) -> None:
        try:
            self._psycopg: Any = importlib.import_module("psycopg")
        except ImportError as e:
            raise MemoryUnavailable(
                "a PostgreSQL memory store needs psycopg: install corral[memory-postgres]"
            ) from e
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conn: Any = None
        with self._lock:
            self._run(self._create_schema)

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self._dsn, autocommit=True, connect_timeout=self._connect_timeout
            )
        except self._psycopg.Error as e:
            # The DSN may hold a password: say what failed, not what was tried.
            raise MemoryUnavailable(f"cannot connect to the PostgreSQL memory store: {e}") from e

    def _run(self, work: Any) -> Any:
        """`work(conn)` on a live connection; a connection that broke is reopened once."""
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            try:
                return work(self._conn)
            except self._psycopg.OperationalError as e:
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise MemoryUnavailable(f"the PostgreSQL memory store failed: {e}") from e
        raise AssertionError("unreachable")

    @staticmethod
    def _create_schema(conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))
            for statement in _PG_SCHEMA:
                conn.execute(statement)

    def insert(
        self,
        scope: str,
        subject: str,
        key: str,
        text: str,
        embedder: str,
        embedding: bytes,
        origin: Origin,
        now: float,
    ) -> int:
        def work(conn: Any) -> int:
            cur = conn.execute(
                "INSERT INTO corral_memory_facts (scope, subject, subject_key, text, embedder,"
                " embedding, updated, origin_session, origin_turn)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (scope, subject, key, text, embedder, embedding, now, origin.session, origin.turn),
            )
            return int(cur.fetchone()[0])

        with self._lock:
            return int(self._run(work))

    def update(
        self,
        scope: str,
        fact_id: int,
        text: str,
        embedder: str,
        embedding: bytes,
        origin: Origin,
        now: float,
    ) -> bool:
        def work(conn: Any) -> bool:
            cur = conn.execute(
                "UPDATE corral_memory_facts SET text = %s, embedder = %s, embedding = %s,"
                " updated = %s, origin_session = %s, origin_turn = %s"
                " WHERE id = %s AND scope = %s",
                (text, embedder, embedding, now, origin.session, origin.turn, fact_id, scope),
            )
            return bool(cur.rowcount > 0)

        with self._lock:
            return bool(self._run(work))

    def delete(self, scope: str, fact_id: int) -> bool:
        def work(conn: Any) -> bool:
            cur = conn.execute(
                "DELETE FROM corral_memory_facts WHERE id = %s AND scope = %s", (fact_id, scope)
            )
            return bool(cur.rowcount > 0)

        with self._lock:
            return bool(self._run(work))

    def link(self, scope: str, a: str, b: str) -> None:
        def work(conn: Any) -> None:
            conn.execute(
                "INSERT INTO corral_memory_links (scope, a, b) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (scope, a, b),
            )

        with self._lock:
            self._run(work)

    def rows(self, scope: str) -> list[Row]:
        def work(conn: Any) -> list[Row]:
            cur = conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM corral_memory_facts WHERE scope = %s ORDER BY id",
                (scope,),
            )
            return [_row(tuple(r)) for r in cur.fetchall()]

        with self._lock:
            found: list[Row] = self._run(work)
        return found

    def links(self, scope: str) -> list[tuple[str, str]]:
        def work(conn: Any) -> list[tuple[str, str]]:
            cur = conn.execute(
                "SELECT a, b FROM corral_memory_links WHERE scope = %s ORDER BY a, b", (scope,)
            )
            return [(a, b) for a, b in cur.fetchall()]

        with self._lock:
            found: list[tuple[str, str]] = self._run(work)
        return found

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
