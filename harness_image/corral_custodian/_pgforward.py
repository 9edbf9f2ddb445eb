"""The memory database behind the egress gateway (docs/egress.md, docs/memory.md).

libpq speaks no HTTP proxy, so behind the gateway the custodian forwards: it listens on a Unix
socket in a directory only its own container mounts (never on loopback or an abstract socket:
the tools container shares the pod's network namespace, so those would reach the database
without any credential), and for each connection opens a CONNECT tunnel through the gateway
with the Session's proxy credential to the DSN's host and port. psycopg gets the DSN rewritten
to that socket: libpq looks for `<dir>/.s.PGSQL.<port>`.

libpq never uses TLS over a Unix socket, so the forwarder keeps the database's TLS itself, as
the DSN's ssl* parameters ask (they are taken out of the DSN psycopg gets):

| sslmode | the forwarder |
| --- | --- |
| `disable`, `allow` | plain |
| `prefer` (libpq's default) | asks (SSLRequest); TLS if the server says `S`, plain if `N` |
| `require` | TLS, the server's certificate not verified, unless `sslrootcert` is given |
| `verify-ca` | TLS, the chain verified against `sslrootcert` |
| `verify-full` | TLS, the chain and the DSN's host name verified |

As in libpq, a given `sslrootcert` makes `prefer` and `require` verify the chain too, and
`sslrootcert=system` (the system's CAs) needs `verify-full`, its default. No `~/.postgresql`
file is read: a certificate is used when the DSN names it. A connection that fails (the
gateway refuses, the server is unreachable, TLS is refused or does not verify) is answered
with a PostgreSQL error naming the reason, so psycopg's error, and the memory store's
MemoryUnavailable, say why; the reason is logged too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import ssl
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from corral_common.proxytunnel import connect_request

log = logging.getLogger("corral_custodian.memory")

DEFAULT_PORT = 5432
# What the forwarder allows itself to open a connection (the CONNECT's answer, then the TLS
# handshake): below the memory store's connect timeout (5 s), so the reason reaches psycopg.
DEFAULT_OPEN_TIMEOUT = 4.0
# As the custodian's own HTTP clients skip the gateway for these (main.use_egress_gateway).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_TLS_REQUIRED = frozenset({"require", "verify-ca", "verify-full"})
_TLS_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
# The ssl* parameters the forwarder applies; any other is refused rather than ignored.
_TLS_PARAMETERS = frozenset({
    "sslmode", "sslnegotiation", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl",
    "sslcrldir", "sslsni", "ssl_min_protocol_version", "ssl_max_protocol_version",
    "sslcompression", "requiressl",
})  # fmt: skip
SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_MAX_HEAD = 64 * 1024
_MAX_STARTUP = 10_000  # libpq's own limit on a startup packet
_CHUNK = 64 * 1024
# A Unix socket's path, NUL included, fits in sockaddr_un's 108 bytes.
_MAX_SOCKET_PATH = 107


class DsnError(ValueError):
    """The memory DSN cannot be forwarded through the gateway (the reason says why)."""


class ForwardFailed(Exception):
    """A connection could not be forwarded; the text is the reason psycopg and the log get."""


@dataclass(frozen=True)
class TlsPolicy:
    """The DSN's ssl* parameters, as the forwarder applies them."""

    mode: str = "prefer"
    direct: bool = False  # sslnegotiation=direct: TLS at once, without the SSLRequest
    rootcert: str | None = None
    cert: str | None = None
    key: str | None = None
    password: str | None = field(default=None, repr=False)
    crl: str | None = None
    crldir: str | None = None
    sni: bool = True
    min_version: str = "TLSv1.2"
    max_version: str | None = None

    @property
    def asks(self) -> bool:
        """Whether the server is asked for TLS at all."""
        return self.mode not in ("disable", "allow")

    @property
    def required(self) -> bool:
        return self.mode in _TLS_REQUIRED

    @property
    def verifies_chain(self) -> bool:
        # libpq: a root certificate that is there is used, whatever the mode that got to TLS.
        return self.mode in ("verify-ca", "verify-full") or self.rootcert is not None

    def context(self) -> ssl.SSLContext:
        """A client context for this policy; ForwardFailed when a named file does not load."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = _TLS_VERSIONS[self.min_version]
        if self.max_version is not None:
            context.maximum_version = _TLS_VERSIONS[self.max_version]
        # PostgreSQL 17 refuses a direct TLS connection without it; older servers ignore it.
        context.set_alpn_protocols(["postgresql"])
        try:
            if self.verifies_chain:
                context.check_hostname = self.mode == "verify-full"
                context.verify_mode = ssl.CERT_REQUIRED
                if self.rootcert == "system":
                    context.load_default_certs()
                elif self.rootcert is None:
                    raise ForwardFailed(
                        f"sslmode={self.mode} needs sslrootcert in the memory DSN (the "
                        "forwarder reads no ~/.postgresql/root.crt)"
                    )
                else:
                    context.load_verify_locations(cafile=self.rootcert)
                if self.crl is not None or self.crldir is not None:
                    context.load_verify_locations(cafile=self.crl, capath=self.crldir)
                    context.verify_flags |= ssl.VERIFY_CRL_CHECK_CHAIN
            else:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.cert is not None:
                context.load_cert_chain(self.cert, self.key, self.password)
        except (OSError, ssl.SSLError) as e:
            raise ForwardFailed(f"the memory DSN's TLS files do not load: {e}") from e
        return context

    def server_hostname(self, host: str) -> str:
        """The name sent as SNI and checked by verify-full; "" sends none (asyncio's spelling
        of no name over a socket it did not open)."""
        if self.mode == "verify-full" or (self.sni and not _is_address(host)):
            return host
        return ""


def use_tls(mode: str, answer: bytes) -> bool:
    """The sslmode decision on the server's one-byte answer to the SSLRequest: TLS or plain;
    ForwardFailed when the server will not give what the mode requires."""
    if answer == b"S":
        return True
    if answer == b"N":
        if mode in _TLS_REQUIRED:
            raise ForwardFailed(
                f"the memory database does not offer TLS (it answered N), and sslmode={mode} "
                "requires it"
            )
        return False
    shown = repr(answer) if answer else "nothing (it closed the connection)"
    raise ForwardFailed(f"the memory database answered the SSL request with {shown}")


@dataclass(frozen=True)
class ForwardPlan:
    """Where the forwarder sends (host, port, TLS), where it listens, and the DSN psycopg gets."""

    host: str
    port: int
    tls: TlsPolicy
    socket_dir: Path
    dsn: str = field(repr=False)

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / f".s.PGSQL.{self.port}"


def plan_forwarding(dsn: str, socket_dir: Path) -> ForwardPlan | None:
    """How to reach the DSN's database through a forwarder on `socket_dir`: None when it needs
    none (a Unix socket, or a loopback host, which the gateway never sees); DsnError when it
    cannot be forwarded. The rewritten DSN keeps every parameter but host, hostaddr, port and
    the ssl* ones (the forwarder applies those)."""
    try:
        from psycopg import ProgrammingError, conninfo
    except ImportError as e:
        raise DsnError(
            "a PostgreSQL memory store needs psycopg: install corral[memory-postgres]"
        ) from e
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except ProgrammingError:
        # psycopg's message quotes the DSN's text, which may hold the password.
        raise DsnError(
            "the memory DSN is not a libpq connection string (URL or key=value)"
        ) from None
    values = {k: str(v) for k, v in params.items() if v is not None}
    if "service" in values:
        raise DsnError(
            "the memory DSN names a service (pg_service.conf), which the forwarder cannot read: "
            "write host and port in the DSN"
        )
    host = values.get("host", "")
    for name in ("host", "hostaddr", "port"):
        if "," in values.get(name, ""):
            raise DsnError(
                f"the memory DSN names more than one {name} ({values[name]!r}); through the "
                "egress gateway it must name one server (one rule, one destination)"
            )
    if not host:
        if values.get("hostaddr"):
            raise DsnError("the memory DSN has hostaddr but no host: the gateway's rule is by name")
        return None  # libpq's default: a local Unix socket
    if host.startswith(("/", "@")) or host.lower() in LOOPBACK_HOSTS:
        return None
    try:
        port = int(values.get("port") or DEFAULT_PORT)
    except ValueError:
        raise DsnError(f"the memory DSN's port {values['port']!r} is not a number") from None
    if not 0 < port < 65536:
        raise DsnError(f"the memory DSN's port {port} is out of range")
    if len(str(socket_dir / f".s.PGSQL.{port}")) > _MAX_SOCKET_PATH:
        raise DsnError(f"the memory socket directory {socket_dir} is too long a path")
    if values.get("channel_binding") == "require":
        raise DsnError(
            "channel_binding=require cannot hold through the forwarder (libpq's connection is "
            "the Unix socket; the forwarder holds the TLS): remove it from the memory DSN"
        )
    tls = tls_policy(values)
    kept = {
        k: v
        for k, v in values.items()
        if k not in _TLS_PARAMETERS and k not in ("host", "hostaddr", "port")
    }
    rewritten = conninfo.make_conninfo("", **kept, host=str(socket_dir), port=str(port))
    return ForwardPlan(host, port, tls, socket_dir, rewritten)


def tls_policy(values: Mapping[str, str]) -> TlsPolicy:
    """The DSN's ssl* parameters as a TlsPolicy; DsnError for one the forwarder cannot apply."""
    unknown = sorted(
        k for k in values if k.startswith(("ssl", "requiressl")) and k not in _TLS_PARAMETERS
    )
    if unknown:
        raise DsnError(
            f"the memory DSN sets {', '.join(unknown)}, which the forwarder does not apply"
        )
    rootcert = values.get("sslrootcert") or None
    mode = values.get("sslmode") or None
    if mode is None:
        legacy = values.get("requiressl", "") == "1"
        # libpq 16: the system's CAs come with host name checks, or not at all.
        mode = "verify-full" if rootcert == "system" else "require" if legacy else "prefer"
    if mode not in SSL_MODES:
        raise DsnError(f"the memory DSN's sslmode {mode!r} is not one of {', '.join(SSL_MODES)}")
    if rootcert == "system" and mode != "verify-full":
        raise DsnError(f"sslrootcert=system needs sslmode=verify-full, not {mode}")
    negotiation = values.get("sslnegotiation") or "postgres"
    if negotiation not in ("postgres", "direct"):
        raise DsnError(f"the memory DSN's sslnegotiation {negotiation!r} is not postgres or direct")
    if negotiation == "direct" and mode not in _TLS_REQUIRED:
        raise DsnError(f"sslnegotiation=direct needs sslmode require or stronger, not {mode}")
    versions = []
    for name in ("ssl_min_protocol_version", "ssl_max_protocol_version"):
        version = values.get(name) or None
        if version is not None and version not in _TLS_VERSIONS:
            raise DsnError(f"the memory DSN's {name} {version!r} is not a TLS version")
        versions.append(version)
    return TlsPolicy(
        mode=mode,
        direct=negotiation == "direct",
        rootcert=rootcert,
        cert=values.get("sslcert") or None,
        key=values.get("sslkey") or None,
        password=values.get("sslpassword") or None,
        crl=values.get("sslcrl") or None,
        crldir=values.get("sslcrldir") or None,
        sni=values.get("sslsni", "1") != "0",
        min_version=versions[0] or "TLSv1.2",
        max_version=versions[1],
    )


def custodian_proxy(proxy: str, user: str, credential: str) -> str:
    """The gateway's URL with the custodian's credential in it, as connect_request reads it."""
    parts = urlsplit(proxy)
    netloc = f"{quote(user, safe='')}:{quote(credential, safe='')}@{parts.netloc}"
    return urlunsplit((parts.scheme, netloc, "", "", ""))


def error_response(message: str) -> bytes:
    """A PostgreSQL ErrorResponse (FATAL, 08001: cannot establish the connection): what libpq
    reports as the reason a connection failed."""
    fields = ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", "08001"), (b"M", message))
    body = b"".join(code + value.encode("utf-8", "replace") + b"\0" for code, value in fields)
    body += b"\0"
    return b"E" + struct.pack("!i", len(body) + 4) + body


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class PgForwarder:
    """The Unix socket psycopg connects to, each connection tunnelled through the gateway."""

    def __init__(
        self, plan: ForwardPlan, proxy: str, *, open_timeout: float = DEFAULT_OPEN_TIMEOUT
    ) -> None:
        """`proxy`: the gateway's URL carrying the custodian's credential (custodian_proxy)."""
        self._plan = plan
        self._proxy = proxy
        self._open_timeout = open_timeout
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # The last connection's failure, None once one got through: for the memory store's
        # reason when psycopg's own error says less.
        self.last_failure: str | None = None

    @property
    def socket_path(self) -> Path:
        return self._plan.socket_path

    async def start(self) -> None:
        """Listen; OSError when the directory is not the custodian's own or cannot be made."""
        directory = self._plan.socket_dir
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.stat()
        if info.st_uid != os.geteuid():
            raise OSError(f"the memory socket directory {directory} belongs to another user")
        os.chmod(directory, 0o700)  # the pod's fsGroup may have made it group-writable
        path = self.socket_path
        # A socket left by an earlier process of this container (its state dir survives).
        if path.is_socket():
            path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))
        os.chmod(path, 0o600)
        log.info(
            "memory database %s:%d forwarded through the egress gateway from %s",
            self._plan.host, self._plan.port, path,
        )  # fmt: skip

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        try:
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------------- a connection

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                server_in, server_out = await asyncio.wait_for(
                    self._open_upstream(), self._open_timeout
                )
            except (ForwardFailed, TimeoutError, OSError) as e:
                await self._refuse(client_in, client_out, self._reason(e))
                return
            self.last_failure = None
            await _relay(client_in, client_out, server_in, server_out)
        finally:
            self._connections.discard(task)
            client_out.close()  # already, unless cancelled while opening (a stop)

    def _reason(self, error: BaseException) -> str:
        where = f"{self._plan.host}:{self._plan.port}"
        if isinstance(error, ForwardFailed):
            return f"memory database {where} through the egress gateway: {error}"
        if isinstance(error, TimeoutError):
            return (
                f"memory database {where} through the egress gateway: no connection within "
                f"{self._open_timeout:g} s"
            )
        return f"memory database {where}: cannot reach the egress gateway: {error}"

    async def _refuse(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter, reason: str
    ) -> None:
        """Log the reason and give it to libpq as a FATAL error, then close."""
        self.last_failure = reason
        log.warning("%s", reason)
        try:
            # libpq's startup packet first: closing a Unix socket with unread data resets it,
            # and the client would read the reset instead of the reason.
            head = await asyncio.wait_for(client_in.readexactly(4), 2)
            (length,) = struct.unpack("!i", head)
            if 8 <= length <= _MAX_STARTUP:
                await asyncio.wait_for(client_in.readexactly(length - 4), 2)
                client_out.write(error_response(reason))
                await client_out.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            client_out.close()
            with contextlib.suppress(OSError):
                await client_out.wait_closed()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The tunnel to the database, with TLS as the policy says; ForwardFailed with why."""
        plan, tls = self._plan, self._plan.tls
        loop = asyncio.get_running_loop()
        sock = await self._connect_gateway()
        try:
            await loop.sock_sendall(sock, connect_request(plan.host, plan.port, self._proxy))
            if await _read_connect_answer(loop, sock):
                # A PostgreSQL server speaks only when spoken to: these are no server's.
                raise ForwardFailed("the tunnel carried bytes before the client spoke")
            secure = tls.direct
            if tls.asks and not tls.direct:
                await loop.sock_sendall(sock, SSL_REQUEST)
                # One byte, no more: anything after 'S' must be the server's TLS, read as TLS.
                secure = use_tls(tls.mode, await loop.sock_recv(sock, 1))
            if not secure:
                return await asyncio.open_connection(sock=sock, limit=_CHUNK)
            try:
                return await asyncio.open_connection(
                    sock=sock,
                    ssl=tls.context(),
                    server_hostname=tls.server_hostname(plan.host),
                    ssl_handshake_timeout=self._open_timeout,
                    limit=_CHUNK,
                )
            except ssl.SSLCertVerificationError as e:
                raise ForwardFailed(f"TLS refused: {e.verify_message or e.reason}") from e
            except ssl.SSLError as e:
                raise ForwardFailed(f"TLS failed: {e.reason or e}") from e
        except BaseException:
            sock.close()
            raise

    async def _connect_gateway(self) -> socket.socket:
        parts = urlsplit(self._proxy)
        if not parts.hostname:
            raise ForwardFailed("the egress proxy URL names no host")
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(parts.hostname, parts.port or 3128, type=socket.SOCK_STREAM)
        failure: OSError = OSError(f"no address for {parts.hostname}")
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
            except OSError as e:
                sock.close()
                failure = e
                continue
            return sock
        raise failure


async def _read_connect_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    """Read the gateway's answer to the CONNECT; the bytes after its head, or ForwardFailed
    with its status line (the gateway's reason: `403 Corral egress: ... is not allowed`)."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk:
            break
        head += chunk
        if len(head) > _MAX_HEAD:
            raise ForwardFailed("the egress gateway's answer has no end")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    version, _, answer = status.partition(" ")
    if not version.startswith("HTTP/") or answer.split(" ")[0] != "200":
        said = f"answered {answer}" if answer else "closed the connection"
        raise ForwardFailed(f"the egress gateway {said}")
    return head.partition(b"\r\n\r\n")[2]


# Authentication request codes (the `R` message): done, and SASL with its mechanisms.
_AUTH_OK = 0
_AUTH_SASL = 10
_CHANNEL_BOUND_SCRAM = b"SCRAM-SHA-256-PLUS"
_MAX_MESSAGE = 1 << 20


def without_channel_binding(message: bytes) -> bytes:
    """An AuthenticationSASL message with SCRAM-SHA-256-PLUS taken out of its mechanisms; any
    other message as it is. A server offers the channel-bound mechanism on a TLS connection;
    libpq, whose own connection (the Unix socket) has no TLS, takes that offer for tampering
    and refuses. The binding would be to the forwarder's TLS, not libpq's: it cannot hold."""
    if message[:1] != b"R" or len(message) < 9:
        return message
    (code,) = struct.unpack("!i", message[5:9])
    if code != _AUTH_SASL:
        return message
    offered = [m for m in message[9:].split(b"\0") if m]
    kept = [m for m in offered if m != _CHANNEL_BOUND_SCRAM]
    if len(kept) == len(offered) or not kept:
        return message
    body = struct.pack("!i", code) + b"".join(m + b"\0" for m in kept) + b"\0"
    return b"R" + struct.pack("!i", len(body) + 4) + body


async def _pass_authentication(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """The server's messages up to the end of authentication (AuthenticationOk or an error),
    one at a time through without_channel_binding; the rest is copied as bytes."""
    while True:
        try:
            head = await source.readexactly(5)
            (length,) = struct.unpack("!i", head[1:])
            if not 4 <= length <= _MAX_MESSAGE:
                sink.write(head)  # not a message: no longer ours to read
                return
            message = head + await source.readexactly(length - 4)
        except asyncio.IncompleteReadError as e:
            sink.write(e.partial)  # the server ended; the copy after passes the end on
            return
        sink.write(without_channel_binding(message))
        await sink.drain()
        kind = message[:1]
        if kind == b"E" or (kind == b"R" and message[5:9] == struct.pack("!i", _AUTH_OK)):
            return


class _NoHalfClose(Exception):
    """The stream that ended cannot be passed on half-closed (TLS): the connection ends."""


async def _copy(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, from_server: bool = False
) -> None:
    if from_server:
        await _pass_authentication(source, sink)
    while data := await source.read(_CHUNK):
        sink.write(data)
        await sink.drain()
    if not sink.can_write_eof():
        raise _NoHalfClose
    sink.write_eof()


async def _relay(
    client_in: asyncio.StreamReader,
    client_out: asyncio.StreamWriter,
    server_in: asyncio.StreamReader,
    server_out: asyncio.StreamWriter,
) -> None:
    """Bytes both ways until both sides are done; a side's end is passed on as a half-close
    where the other's stream can carry one (TLS cannot: then the connection ends, as
    PostgreSQL expects nothing after the client's Terminate)."""
    tasks = [
        asyncio.ensure_future(_copy(client_in, server_out)),
        asyncio.ensure_future(_copy(server_in, client_out, from_server=True)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in (server_out, client_out):
            writer.close()
        for writer in (server_out, client_out):
            with contextlib.suppress(OSError):  # ssl.SSLError is one
                await writer.wait_closed()
