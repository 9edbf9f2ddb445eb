"""A throwaway PostgreSQL server for the memory tests: initdb + pg_ctl in a temporary directory,
on a free loopback port, with password authentication, run as an unprivileged user
(PostgreSQL refuses to run as root: under root the server runs as `nobody`).

The binaries come from Debian's `postgresql` package; `hack/install-postgres.sh` installs it
when missing. When the server cannot start, the tests FAIL with CORRAL_REQUIRE_NODE=1 (CI) and
are skipped with the reason otherwise, as the node tier does.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral_dev.ports import free_port

PROJECT = Path(__file__).resolve().parent.parent
INSTALL = PROJECT / "hack" / "install-postgres.sh"
REQUIRE = os.environ.get("CORRAL_REQUIRE_NODE", "") not in ("", "0")
NOBODY = 65534


@dataclass(frozen=True)
class Postgres:
    dsn: str
    port: int
    password: str


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"CORRAL_REQUIRE_NODE is set and PostgreSQL cannot run: {reason}", False)
    pytest.skip(f"PostgreSQL cannot run here: {reason} (set CORRAL_REQUIRE_NODE=1 to fail)")


@contextmanager
def running_postgres() -> Iterator[Postgres]:
    """Start a server, yield its DSN, stop it and remove its files."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True)
        bin_dir = _bin_dir()
        if bin_dir is None:
            unavailable(f"no initdb, and {INSTALL.name} failed: {done.stderr.strip()[-500:]}")
    assert bin_dir is not None
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="corral-pg-"))
    data, log = base / "data", base / "server.log"
    password = secrets.token_urlsafe(16)
    (base / "pw").write_text(password + "\n")
    if as_root:
        os.chown(base, NOBODY, NOBODY)
        os.chown(base / "pw", NOBODY, NOBODY)
    port = free_port()
    user = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if as_root else {}
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(base)}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=base, env=env, capture_output=True, text=True, timeout=120, **user
        )

    try:
        init = run(
            str(bin_dir / "initdb"), "-D", str(data), "-U", "corral", "--auth=scram-sha-256",
            f"--pwfile={base / 'pw'}", "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        if init.returncode != 0:
            unavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        started = run(
            str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
            "-t", "60", "start",
        )  # fmt: skip
        if started.returncode != 0:
            text = log.read_text() if log.exists() else started.stderr
            unavailable(f"pg_ctl start failed: {text.strip()[-800:]}")
        dsn = f"postgresql://corral:{password}@127.0.0.1:{port}/postgres"
        yield Postgres(dsn, port, password)
    finally:
        if (data / "postmaster.pid").exists():
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        deadline = time.monotonic() + 10
        while (data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(base, ignore_errors=True)
