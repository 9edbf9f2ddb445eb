"""`corral-custodian`: the sandbox pod's credential holder. Configured by environment:

CORRAL_CUSTODIAN_ADDR        host:port of the harness-facing listener (default 127.0.0.1:8081)
CORRAL_CUSTODIAN_CREDENTIAL_FILE   the pod-local credential every caller but /readyz presents
                             (Authorization: Bearer, or x-api-key on /v1/messages)
CORRAL_CUSTODIAN_INSECURE    1: start without a credential file and serve anyone (local only)
CORRAL_CUSTODIAN_OPERATOR_ADDR   host:port of the operator listener (GET /v1/usage); unset: none
CORRAL_WIRE_TOKEN_FILE       the Session's wire token, the operator listener's only credential
CORRAL_UPSTREAM_URL          the real model endpoint (default https://api.anthropic.com)
ANTHROPIC_API_KEY or CORRAL_MODEL_KEY_FILE   the model key (the harness never has it)
CORRAL_SESSION_NAME / _NAMESPACE / _UID      the session this pod serves
CORRAL_AGENT_NAME            its Agent, read from the cluster (default: the Session's agentRef)
CORRAL_BUDGET_TOKENS, CORRAL_BUDGET_COST     the Session's budget; 0 or unset: no cap
CORRAL_USAGE_SEED            a resumed Session's spending so far (JSON: input, output,
                             cacheRead, cacheWrite, cost): the record starts there, not at 0
CORRAL_STATE_DIR             usage records (kept across restarts) and the push mirror, into
                             which the harness's bundles of the agent's commits are taken
                             (the custodian never opens the workspace)
CORRAL_AGENT_SPEC_FILE or CORRAL_AGENT_SPEC_JSON   the Agent spec when there is no cluster
CORRAL_MODEL_OVERRIDE        the Session's overrides.model when there is no cluster
CORRAL_KUBE_API, CORRAL_KUBE_TOKEN_FILE, CORRAL_KUBE_CA_FILE   the cluster; unset: none
CORRAL_GIT_CREDENTIALS_FILE  git credential-store file used for push and land
CORRAL_SESSION_BRANCH        the only branch push may target
CORRAL_GIT_REMOTE_URL        where push and land send (the Session's workspace.repo); the only
                             source of the remote, which must be a network URL
CORRAL_READ_ONLY             1: no push, no land
CORRAL_LOCAL_SESSIONS_DIR    without a cluster: the session tree of `corral run`, where
                             children are created and read (docs/children.md)
CORRAL_OTLP_ENDPOINT         the trace collector (OTLP/HTTP base URL; /v1/traces is appended,
                             or CORRAL_OTLP_TRACES_ENDPOINT names the URL itself): the
                             harness's traces are relayed there (POST /otlp/v1/traces)
CORRAL_MAX_REQUEST_BYTES     largest request body accepted (default 8 MiB)
CORRAL_MAX_MODEL_REQUESTS    model requests in flight at once (default 4)
CORRAL_MAX_BUNDLE_BYTES      largest bundle of the agent's commits taken (default 64 MiB)
CORRAL_MAX_BLOB_BYTES        largest object in such a bundle (default 32 MiB)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine, Generator, Mapping
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from corral_common import logs
from corral_common.asgi import LISTEN_FD_ENV
from corral_common.catalog import CatalogError, check_catalog

from ._adopt import ADOPT_KEY_ENV, serve_pooled
from ._app import Custodian, create_app, create_operator_app
from ._egress import use_egress_gateway
from ._secrets import RedactResponses, redact, redact_handlers
from .settings import (
    CustodianSettings,
    SettingsError,
    from_env,
    register_credentials,
    register_model_key,
)

log = logging.getLogger("corral_custodian")


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to `serve`, which stops both listeners together."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _server(app: ASGIApp, host: str, port: int) -> _Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=os.environ.get("CORRAL_LOG_LEVEL", "warning"),
        log_config=None,  # uvicorn's lines go through main's handler, in its format
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    return _Server(config)


async def serve(settings: CustodianSettings) -> None:
    core = Custodian(settings)
    listeners: list[tuple[ASGIApp, str, int]] = [(create_app(core), settings.host, settings.port)]
    if settings.operator_host is not None and settings.operator_port is not None:
        listeners.append(
            (create_operator_app(core), settings.operator_host, settings.operator_port)
        )
    try:
        await listen(listeners)
    finally:
        await core.aclose()


async def listen(listeners: list[tuple[ASGIApp, str, int]]) -> None:
    """Serve each (app, host, port) until a signal, or until one listener ends. Every body a
    listener answers leaves through the redactor (_secrets.RedactResponses)."""
    servers = [_server(RedactResponses(app), host, port) for app, host, port in listeners]
    # The harness-facing listener may be inherited, already bound (`corral run`).
    inherited = _inherited_listener(os.environ)

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    tasks = [
        asyncio.ensure_future(s.serve(sockets=inherited if i == 0 else None))
        for i, s in enumerate(servers)
    ]
    # One listener ending (a bind failure, say) ends the other: both or neither.
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop()
    await asyncio.gather(*tasks)


def _inherited_listener(env: Mapping[str, str]) -> list[socket.socket] | None:
    fd = env.get(LISTEN_FD_ENV, "").strip()
    if not fd:
        return None
    if not fd.isdigit():
        raise SettingsError(f"{LISTEN_FD_ENV} must be a file descriptor, not {fd!r}")
    sock = socket.socket(fileno=int(fd))
    sock.set_inheritable(False)
    return [sock]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="corral-custodian",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    # Refusals are logged as warnings, naming the caller: they are what an operator looks for.
    try:  # JSON lines carry the run id of the request (docs/observability.md)
        logs.configure(logs.parse_format(os.environ.get(logs.LOG_FORMAT_ENV)), logging.WARNING)
    except ValueError as e:
        print(f"corral-custodian: {e}", file=sys.stderr)
        return 2
    # Every line leaves redacted: the custodian's own, uvicorn's (its loggers propagate to the
    # root handler, log_config=None) and a library's.
    redact_handlers(logging.getLogger().handlers)
    # Its own notes (a run's first model request, facts kept) at INFO; the rest, warnings.
    logging.getLogger("corral_custodian").setLevel(logging.INFO)
    key = os.environ.get(ADOPT_KEY_ENV, "").strip()
    if key:  # a warm-pool pod: no Session until the operator adopts it (docs/warm-pool.md)
        try:
            register_model_key(os.environ)  # held before the adopt; the rest come with it
            check_catalog()
            return _run(serve_pooled(os.environ, key, listen))
        except (SettingsError, CatalogError) as e:
            print(f"corral-custodian: {redact(str(e))}", file=sys.stderr)
            return 2
    try:
        settings = from_env(os.environ)
        register_credentials(settings)  # before anything can answer or log a value
        use_egress_gateway(settings, os.environ)
    except SettingsError as e:
        print(f"corral-custodian: {redact(str(e))}", file=sys.stderr)
        return 2
    try:
        check_catalog()  # the allowlist and the max_tokens clamp read it: a bad overlay stops here
    except CatalogError as e:
        print(f"corral-custodian: {e}", file=sys.stderr)
        return 2
    return _run(serve(settings))


def _run(main: Coroutine[Any, Any, None]) -> int:
    """Run `main`; a crash is logged (so redacted) rather than printed raw by Python."""
    try:
        asyncio.run(main)
    except (SettingsError, CatalogError):
        raise
    except Exception:
        log.exception("the custodian stopped on an error")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
