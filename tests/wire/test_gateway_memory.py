"""The memory database behind the egress gateway: the custodian forwards PostgreSQL through a
Unix socket of its own and a CONNECT tunnel carrying the Session's proxy credential
(harness_image/corral_custodian/_pgforward.py, docs/egress.md).

Real parts: two PostgreSQL servers (one with TLS on, a self-signed certificate for db.test;
the shared one without), the real corral-gateway (a binding for 127.0.0.1, the source the
forwarder connects from, whose custodian rules name the databases; a second gateway whose
binding lacks them), the real custodian process, and psycopg through the forwarder.
db.test, other-db.test, plain-db.test and gone-db.test are names of the gateway's hosts file
for 127.0.0.1, which only a private (platform) rule reaches.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corral_common.memory import MemoryStore, MemoryUnavailable, PostgresBackend
from corral_custodian._pgforward import PgForwarder, custodian_proxy, plan_forwarding
from corral_dev.ports import free_port
from tests._postgres import NOBODY, Postgres, running_postgres
from tests.unit.custodian._custodian_proc import running_custodian

from ._gateway import Gateway, binding, self_signed, start_gateway, write_bindings

pytestmark = pytest.mark.timeout(120)

CREDENTIAL = "session-proxy-credential-for-the-memory-database"
AGENT: dict[str, Any] = {
    "identity": "You are a test agent.",
    "model": "corral-scripted",
    "tools": {"allow": ["mcp__corral__memory_*"]},
    "memory": {},
}


@dataclass
class Rig:
    tls_db: Postgres  # ssl=on, a certificate for db.test
    plain_db: Postgres  # ssl=off
    gateway: Gateway  # the custodian may reach both databases
    closed: Gateway  # the custodian's rules name neither
    ca: Path
    wrong_ca: Path
    work: Path

    def proxy(self, gateway: Gateway | None = None, credential: str = CREDENTIAL) -> str:
        return custodian_proxy((gateway or self.gateway).proxy_url, "custodian", credential)

    def dsn(self, host: str, query: str, db: Postgres | None = None) -> str:
        db = db or self.tls_db
        return f"postgresql://corral:{db.password}@{host}:{db.port}/postgres?{query}"


def _enable_tls(db: Postgres, work: Path) -> Path:
    """Turn TLS on in a running server, with a self-signed certificate for db.test; its CA."""
    cert, key = self_signed(work, ["db.test"])
    if os.geteuid() == 0:  # the server runs as nobody, and wants its key its own, 0600
        os.chown(key, NOBODY, NOBODY)
    key.chmod(0o600)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET ssl_cert_file = '{cert}'")
        conn.execute(f"ALTER SYSTEM SET ssl_key_file = '{key}'")
        conn.execute("ALTER SYSTEM SET ssl = on")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while True:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            row = conn.execute("SHOW ssl").fetchone()
        if row is not None and row[0] == "on":
            return cert
        assert time.monotonic() < deadline, "the server did not turn TLS on"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def rig(postgres: Postgres) -> Iterator[Rig]:
    # Outside pytest's 0700 temporary tree: the server (nobody) reads the certificate here.
    work = Path(tempfile.mkdtemp(prefix="corral-gwmem-"))
    work.chmod(0o755)
    (work / "wrong").mkdir(mode=0o755)
    wrong_ca, _ = self_signed(work / "wrong", ["db.test"])
    hosts = work / "hosts"
    hosts.write_text("127.0.0.1 db.test other-db.test plain-db.test gone-db.test\n")
    gone = free_port()  # nothing listens there
    gateways: list[Gateway] = []
    try:
        with running_postgres() as tls_db:
            ca = _enable_tls(tls_db, work)

            def rule(host: str, port: int) -> dict[str, Any]:
                return {"host": host, "ports": [port], "private": True}

            open_rules = [
                rule("db.test", tls_db.port),
                rule("other-db.test", tls_db.port),
                rule("plain-db.test", postgres.port),
                rule("gone-db.test", gone),
            ]
            for name, rules in (("open", open_rules), ("closed", [rule("web.test", 443)])):
                bindings = work / f"{name}-bindings.json"
                custodian = binding(
                    namespace="team",
                    session="s1",
                    agent="agent",
                    credential=CREDENTIAL,
                    custodian_rules=rules,
                )
                write_bindings(bindings, [("127.0.0.1", f"uid-{name}", custodian)])
                flags = ["--bindings-file", str(bindings), "--hosts-file", str(hosts)]
                flags += ["--connect-timeout", "2s"]
                gateways.append(start_gateway(work / name, flags))
            yield Rig(tls_db, postgres, gateways[0], gateways[1], ca, wrong_ca, work)
    finally:
        for gateway in gateways:
            gateway.stop()
        shutil.rmtree(work, ignore_errors=True)


@asynccontextmanager
async def forwarded(dsn: str, proxy: str) -> AsyncIterator[tuple[PgForwarder, str]]:
    """A forwarder for `dsn` through `proxy`, on a short socket path of its own; the DSN
    psycopg gets."""
    directory = Path(tempfile.mkdtemp(prefix="pgf-"))
    plan = plan_forwarding(dsn, directory / "sock")
    assert plan is not None
    forwarder = PgForwarder(plan, proxy)
    await forwarder.start()
    try:
        yield forwarder, plan.dsn
    finally:
        await forwarder.aclose()
        shutil.rmtree(directory, ignore_errors=True)


def _ssl_of(db: Postgres, application: str) -> bool:
    """pg_stat_ssl's verdict on the server's session of `application`."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.application_name = %s",
            (application,),
        ).fetchone()
    assert row is not None, f"no session of {application}"
    return bool(row[0])


async def _open(dsn: str) -> PostgresBackend:
    return await asyncio.to_thread(PostgresBackend, dsn)


# ------------------------------------------------------------------ the custodian itself


def _custodian_env(rig: Rig, tmp_path: Path, gateway: Gateway, dsn: str) -> dict[str, str]:
    (tmp_path / "egress").write_text(CREDENTIAL + "\n")
    (tmp_path / "dsn").write_text(dsn + "\n")
    return {
        "CORRAL_SESSION_NAME": "s1",
        "CORRAL_SESSION_NAMESPACE": "team",
        "CORRAL_AGENT_NAME": "agent",
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        "CORRAL_EGRESS_PROXY": gateway.proxy_url,
        "CORRAL_EGRESS_CREDENTIAL_FILE": str(tmp_path / "egress"),
        "CORRAL_MEMORY_DSN_FILE": str(tmp_path / "dsn"),
        "CORRAL_MEMORY_SOCKET_DIR": tempfile.mkdtemp(prefix="pgc-") + "/sock",
    }


def test_the_custodian_remembers_and_recalls_through_the_gateway_over_verified_tls(
    rig: Rig, tmp_path: Path
) -> None:
    application = "corral-memory-through-the-gateway"
    dsn = rig.dsn(
        "db.test", f"sslmode=verify-full&sslrootcert={rig.ca}&application_name={application}"
    )
    env = _custodian_env(rig, tmp_path, rig.gateway, dsn)
    with running_custodian(env, tmp_path / "custodian.log", operator=False) as custodian:
        with custodian.client() as client:
            added = client.post(
                "/agents/c1/tools/memory_add",
                json={"subject": "billing", "text": "Deploys need the finance team's sign-off."},
                headers={"x-corral-submission": "sub-1"},
            )
            assert added.status_code == 200 and added.json()["isError"] is False, added.text
            recalled = client.post("/memory/recall", json={"query": "billing deploys"})
            assert recalled.status_code == 200, recalled.text
            assert any("finance team's sign-off" in line for line in recalled.json()["lines"])
            # The custodian's session is TLS at the server, with the DSN's application_name
            # carried through the rewrite.
            assert _ssl_of(rig.tls_db, application) is True
        socket_path = Path(env["CORRAL_MEMORY_SOCKET_DIR"]) / f".s.PGSQL.{rig.tls_db.port}"
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
    assert not socket_path.exists()  # removed when the custodian stops
    went = [d for d in rig.gateway.decisions() if d["host"] == "db.test"]
    assert went and all(d["identity"] == "custodian" for d in went), went
    assert {d["decision"] for d in went} == {"allowed"}, went


def test_a_binding_without_the_database_leaves_memory_unavailable_with_the_reason(
    rig: Rig, tmp_path: Path
) -> None:
    env = _custodian_env(rig, tmp_path, rig.closed, rig.dsn("db.test", "sslmode=require"))
    log = tmp_path / "custodian.log"
    with running_custodian(env, log, operator=False) as custodian, custodian.client() as client:
        started = time.monotonic()
        recalled = client.post("/memory/recall", json={"query": "billing"})
        assert time.monotonic() - started < 5  # a refusal, not a timeout
        added = client.post(
            "/agents/c1/tools/memory_add", json={"subject": "billing", "text": "A fact."}
        )
    assert recalled.status_code == 503, recalled.text
    reason = recalled.json()["reason"]
    assert "the egress gateway answered 403" in reason and "is not allowed" in reason, reason
    assert "db.test" in reason
    assert added.json()["isError"] is True
    assert "memory is unavailable right now" in added.json()["content"]
    assert "403" in added.json()["content"]
    assert "the egress gateway answered 403" in log.read_text()


# ------------------------------------------------------------------ the forwarder


async def test_a_fact_written_through_the_forwarder_is_read_back(rig: Rig) -> None:
    dsn = rig.dsn("db.test", f"sslmode=verify-full&sslrootcert={rig.ca}")
    async with forwarded(dsn, rig.proxy()) as (_, local_dsn):
        backend = await _open(local_dsn)
        try:
            store = MemoryStore(backend, "team/forwarded")
            fact = await asyncio.to_thread(store.add, "release train", "Thursdays at 14:00.")
            hits = await asyncio.to_thread(store.recall, "release train")
            assert [h.fact.id for h in hits] == [fact]
        finally:
            await asyncio.to_thread(backend.close)


async def test_a_wrong_credential_gets_the_gateways_407(rig: Rig) -> None:
    dsn = rig.dsn("db.test", "sslmode=require")
    wrong = rig.proxy(credential="a-forged-or-rotated-proxy-credential")
    async with forwarded(dsn, wrong) as (forwarder, local_dsn):
        with pytest.raises(MemoryUnavailable, match="the egress gateway answered 407"):
            await _open(local_dsn)
        assert forwarder.last_failure is not None and "407" in forwarder.last_failure


async def test_an_unreachable_database_is_the_gateways_502(rig: Rig) -> None:
    port = next(r["ports"][0] for r in _open_rules(rig) if r["host"] == "gone-db.test")
    dsn = f"postgresql://corral:{rig.tls_db.password}@gone-db.test:{port}/postgres"
    async with forwarded(dsn, rig.proxy()) as (_, local_dsn):
        with pytest.raises(MemoryUnavailable, match="the egress gateway answered 502"):
            await _open(local_dsn)


def _open_rules(rig: Rig) -> list[dict[str, Any]]:
    bindings = json.loads((rig.work / "open-bindings.json").read_text())
    rules: list[dict[str, Any]] = bindings[0]["binding"]["custodianRules"]
    return rules


def _tcp_listeners_of_this_process() -> set[int]:
    """The socket inodes of this process that listen on TCP (v4 or v6)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(int(target[8:-1]))
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                listening.add(int(fields[9]))
    return mine & listening


async def test_the_socket_is_the_custodians_alone_and_no_tcp_listener(rig: Rig) -> None:
    before = _tcp_listeners_of_this_process()
    dsn = rig.dsn("db.test", "sslmode=require")
    async with forwarded(dsn, rig.proxy()) as (forwarder, local_dsn):
        path = forwarder.socket_path
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert _tcp_listeners_of_this_process() == before
        # Bound to a path, not to the abstract namespace the tools container could reach.
        unix = Path("/proc/net/unix").read_text()
        assert str(path) in unix and f"@{path}" not in unix
        assert f"host={path.parent}" in local_dsn and "sslmode" not in local_dsn
        # It answers at that path, and nothing else of it listens.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await asyncio.get_running_loop().sock_connect(probe, str(path))
        probe.close()


# ------------------------------------------------------------------ the database's TLS


@pytest.mark.parametrize(
    ("server", "sslmode", "over_tls"),
    [
        ("db.test", "require", True),
        ("db.test", "prefer", True),
        ("db.test", "disable", False),
        ("plain-db.test", "prefer", False),
    ],
)
async def test_the_forwarder_keeps_tls_as_the_sslmode_asks(
    rig: Rig, server: str, sslmode: str, over_tls: bool
) -> None:
    db = rig.tls_db if server == "db.test" else rig.plain_db
    application = f"corral-sslmode-{sslmode}-{server}"
    dsn = rig.dsn(server, f"sslmode={sslmode}&application_name={application}", db)
    async with forwarded(dsn, rig.proxy()) as (_, local_dsn):
        backend = await _open(local_dsn)
        try:
            assert await asyncio.to_thread(_ssl_of, db, application) is over_tls
        finally:
            await asyncio.to_thread(backend.close)


async def test_tls_required_of_a_server_without_it_is_refused(rig: Rig) -> None:
    dsn = rig.dsn("plain-db.test", "sslmode=require", rig.plain_db)
    async with forwarded(dsn, rig.proxy()) as (_, local_dsn):
        with pytest.raises(MemoryUnavailable, match=r"does not offer TLS.*sslmode=require"):
            await _open(local_dsn)


async def test_verify_full_checks_the_root_certificate_and_the_name(rig: Rig) -> None:
    right = rig.dsn("db.test", f"sslmode=verify-full&sslrootcert={rig.ca}")
    async with forwarded(right, rig.proxy()) as (_, local_dsn):
        await asyncio.to_thread((await _open(local_dsn)).close)

    wrong = rig.dsn("db.test", f"sslmode=verify-full&sslrootcert={rig.wrong_ca}")
    async with forwarded(wrong, rig.proxy()) as (_, local_dsn):
        with pytest.raises(MemoryUnavailable, match=r"TLS refused: .*certificate"):
            await _open(local_dsn)

    # The certificate names db.test: verify-full refuses it for other-db.test, verify-ca not.
    other = rig.dsn("other-db.test", f"sslmode=verify-full&sslrootcert={rig.ca}")
    async with forwarded(other, rig.proxy()) as (_, local_dsn):
        with pytest.raises(MemoryUnavailable, match=r"TLS refused: .*other-db\.test"):
            await _open(local_dsn)
    chain_only = rig.dsn("other-db.test", f"sslmode=verify-ca&sslrootcert={rig.ca}")
    async with forwarded(chain_only, rig.proxy()) as (_, local_dsn):
        await asyncio.to_thread((await _open(local_dsn)).close)
