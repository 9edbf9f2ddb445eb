"""The memory database's forwarder behind the egress gateway (_pgforward.py): the DSN psycopg
gets, the sslmode decisions, the authentication message it mends, and the MemoryService that
starts it. The forwarder against the real gateway and PostgreSQL: tests/wire/test_gateway_memory.py.
"""

from __future__ import annotations

import json
import shutil
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from corral_common.memory import MemoryUnavailable
from corral_custodian._live import LiveState
from corral_custodian._memory import MemoryService
from corral_custodian._pgforward import (
    DsnError,
    ForwardFailed,
    TlsPolicy,
    error_response,
    plan_forwarding,
    tls_policy,
    use_tls,
    without_channel_binding,
)
from corral_custodian.settings import from_env
from corral_dev.ports import free_port

SOCKETS = Path("/run/corral-test/memory")


# ------------------------------------------------------------------ the DSN psycopg gets


def test_a_url_dsn_points_at_the_socket_and_keeps_all_but_host_port_and_tls() -> None:
    dsn = (
        "postgresql://corral:p%40ss%20word@db.example.internal:5433/memory"
        "?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=custodian"
        "&options=-c%20statement_timeout%3D5000&connect_timeout=3"
    )
    plan = plan_forwarding(dsn, SOCKETS)
    assert plan is not None
    assert (plan.host, plan.port) == ("db.example.internal", 5433)
    assert plan.socket_path == SOCKETS / ".s.PGSQL.5433"  # where libpq looks
    assert plan.tls == TlsPolicy(mode="verify-full", rootcert="/etc/ca.pem")
    assert conninfo_to_dict(plan.dsn) == {
        "host": str(SOCKETS),
        "port": "5433",
        "user": "corral",
        "password": "p@ss word",
        "dbname": "memory",
        "application_name": "custodian",
        "options": "-c statement_timeout=5000",
        "connect_timeout": "3",
    }


def test_a_key_value_dsn_is_rewritten_the_same_way() -> None:
    dsn = r"host=db.example port=6000 user=corral password='it\'s secret' dbname=m sslmode=require"
    plan = plan_forwarding(dsn, SOCKETS)
    assert plan is not None
    assert (plan.host, plan.port, plan.tls.mode) == ("db.example", 6000, "require")
    assert conninfo_to_dict(plan.dsn) == {
        "host": str(SOCKETS),
        "port": "6000",
        "user": "corral",
        "password": "it's secret",
        "dbname": "m",
    }


def test_the_default_port_and_sslmode_are_libpqs() -> None:
    plan = plan_forwarding("postgresql://corral@db.example/corral", SOCKETS)
    assert plan is not None
    assert plan.port == 5432 and plan.tls.mode == "prefer"
    assert plan.socket_path.name == ".s.PGSQL.5432"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://corral@/corral?host=/var/run/postgresql",  # a Unix socket already
        "postgresql://corral@localhost/corral",
        "postgresql://corral@127.0.0.1:5432/corral",
        "host=::1 dbname=corral",
        "dbname=corral",  # no host: libpq's local socket
    ],
)
def test_a_local_database_is_not_forwarded(dsn: str) -> None:
    assert plan_forwarding(dsn, SOCKETS) is None


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("postgresql://corral@a.example:5432,b.example:5433/corral", "more than one host"),
        ("host=a.example,b.example dbname=corral", "more than one host"),
        ("host=db.example hostaddr=10.0.0.1,10.0.0.2", "more than one hostaddr"),
        ("hostaddr=10.0.0.1 dbname=corral", "hostaddr but no host"),
        ("service=memory", "names a service"),
        ("host=db.example port=99999", "out of range"),
        ("host=db.example sslmode=verify-sometimes", "sslmode 'verify-sometimes'"),
        ("host=db.example sslrootcert=system sslmode=require", "needs sslmode=verify-full"),
        ("host=db.example sslnegotiation=direct", "needs sslmode require or stronger"),
        ("host=db.example ssl_min_protocol_version=SSLv3", "is not a TLS version"),
        ("host=db.example sslkeylogfile=/tmp/keys", "does not apply"),
        ("host=db.example channel_binding=require", "channel_binding=require cannot hold"),
    ],
)
def test_what_cannot_be_forwarded_is_refused_with_the_reason(dsn: str, reason: str) -> None:
    with pytest.raises(DsnError, match=reason):
        plan_forwarding(dsn, SOCKETS)


def test_a_dsn_that_does_not_parse_is_refused_without_quoting_it() -> None:
    # psycopg's own message would quote the token it could not read: here, a password.
    with pytest.raises(DsnError, match="not a libpq connection string") as caught:
        plan_forwarding("host=db.example hunter2-secret", SOCKETS)
    assert "hunter2" not in str(caught.value)


def test_a_socket_path_longer_than_a_unix_address_is_refused() -> None:
    with pytest.raises(DsnError, match="too long"):
        plan_forwarding("host=db.example", Path("/" + "d" * 100))


# ------------------------------------------------------------------ the sslmode decisions


@pytest.mark.parametrize(
    ("mode", "asks", "required"),
    [
        ("disable", False, False),
        ("allow", False, False),
        ("prefer", True, False),
        ("require", True, True),
        ("verify-ca", True, True),
        ("verify-full", True, True),
    ],
)
def test_which_modes_ask_for_tls_and_which_require_it(
    mode: str, asks: bool, required: bool
) -> None:
    policy = tls_policy({"sslmode": mode})
    assert (policy.asks, policy.required) == (asks, required)
    if asks:
        assert use_tls(mode, b"S") is True
    if required:
        with pytest.raises(ForwardFailed, match=f"does not offer TLS.*sslmode={mode}"):
            use_tls(mode, b"N")
    elif asks:
        assert use_tls(mode, b"N") is False  # prefer: plain when the server has no TLS


def test_an_answer_other_than_s_or_n_fails() -> None:
    with pytest.raises(ForwardFailed, match="answered the SSL request with b'E'"):
        use_tls("prefer", b"E")
    with pytest.raises(ForwardFailed, match="closed the connection"):
        use_tls("require", b"")


def test_what_is_verified() -> None:
    assert not tls_policy({"sslmode": "require"}).verifies_chain
    # libpq: a given root certificate is used, in require (and prefer) too.
    assert tls_policy({"sslmode": "require", "sslrootcert": "/ca.pem"}).verifies_chain
    assert tls_policy({"sslmode": "verify-ca", "sslrootcert": "/ca.pem"}).verifies_chain
    assert tls_policy({"sslrootcert": "system"}).mode == "verify-full"
    assert tls_policy({"requiressl": "1"}).mode == "require"
    assert tls_policy({}).mode == "prefer"


def test_the_server_name_sent_and_checked() -> None:
    assert tls_policy({"sslmode": "require"}).server_hostname("db.example") == "db.example"
    assert tls_policy({"sslmode": "require"}).server_hostname("10.0.0.5") == ""  # no SNI
    assert tls_policy({"sslmode": "require", "sslsni": "0"}).server_hostname("db.example") == ""
    full = tls_policy({"sslmode": "verify-full", "sslrootcert": "/ca.pem", "sslsni": "0"})
    assert full.server_hostname("10.0.0.5") == "10.0.0.5"  # the name verify-full checks


def test_a_verifying_mode_without_a_root_certificate_fails_to_connect() -> None:
    with pytest.raises(ForwardFailed, match="needs sslrootcert"):
        tls_policy({"sslmode": "verify-ca"}).context()
    with pytest.raises(ForwardFailed, match="TLS files do not load"):
        tls_policy({"sslmode": "verify-ca", "sslrootcert": "/nonexistent/ca.pem"}).context()


# ------------------------------------------------------------------ the protocol


def _sasl(*mechanisms: bytes) -> bytes:
    body = struct.pack("!i", 10) + b"".join(m + b"\0" for m in mechanisms) + b"\0"
    return b"R" + struct.pack("!i", len(body) + 4) + body


def test_the_channel_bound_mechanism_is_taken_out_of_the_servers_offer() -> None:
    offered = _sasl(b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256")
    assert without_channel_binding(offered) == _sasl(b"SCRAM-SHA-256")
    assert without_channel_binding(_sasl(b"SCRAM-SHA-256")) == _sasl(b"SCRAM-SHA-256")
    ok = b"R" + struct.pack("!ii", 8, 0)
    assert without_channel_binding(ok) == ok


def test_the_error_libpq_gets_is_a_fatal_error_response() -> None:
    message = error_response("the egress gateway answered 403 Corral egress: no")
    assert message[:1] == b"E"
    (length,) = struct.unpack("!i", message[1:5])
    assert length == len(message) - 1
    fields = dict((f[:1], f[1:].decode()) for f in message[5:-1].split(b"\0") if f)
    assert fields == {
        b"S": "FATAL",
        b"V": "FATAL",
        b"C": "08001",
        b"M": "the egress gateway answered 403 Corral egress: no",
    }


# ------------------------------------------------------------------ the custodian's store


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket's address is at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="pgfu-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _service(directory: Path, *, gateway: bool) -> MemoryService:
    (directory / "dsn").write_text("postgresql://corral:memory-password-1@db.example/corral\n")
    (directory / "egress").write_text("custodian-proxy-credential-0123456789\n")
    env = {
        "CORRAL_CUSTODIAN_INSECURE": "1",
        "CORRAL_AGENT_SPEC_JSON": json.dumps({"identity": "x", "model": "m", "memory": {}}),
        "CORRAL_MEMORY_DSN_FILE": str(directory / "dsn"),
        "CORRAL_STATE_DIR": str(directory / "state"),
    }
    if gateway:
        # Nothing listens there: the gateway cannot be reached.
        env["CORRAL_EGRESS_PROXY"] = f"http://127.0.0.1:{free_port()}"
        env["CORRAL_EGRESS_CREDENTIAL_FILE"] = str(directory / "egress")
    settings = from_env(env)
    return MemoryService(settings, LiveState(settings, None))


async def test_behind_the_gateway_the_store_goes_through_the_forwarder(short_dir: Path) -> None:
    service = _service(short_dir, gateway=True)
    with pytest.raises(MemoryUnavailable, match="cannot reach the egress gateway") as caught:
        await service._backend_now()
    assert f'socket "{short_dir}/state/memory-socket/.s.PGSQL.5432"' in str(caught.value)
    forwarder = service.forwarder
    assert forwarder is not None
    socket_path = short_dir / "state" / "memory-socket" / ".s.PGSQL.5432"
    assert forwarder.socket_path == socket_path
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
    await service.aclose()
    assert not socket_path.exists() and service.forwarder is None


async def test_without_the_gateway_there_is_no_forwarder(short_dir: Path) -> None:
    service = _service(short_dir, gateway=False)
    dsn = "postgresql://corral:memory-password-1@db.example/corral"
    assert await service._postgres_dsn(dsn) == dsn
    assert service.forwarder is None
    assert not (short_dir / "state" / "memory-socket").exists()
