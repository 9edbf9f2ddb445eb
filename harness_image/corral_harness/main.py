"""`corral-harness`: serve the wire (`corral_api.wire`) on CORRAL_HARNESS_ADDR.

By hand, against the scripted model::

    python -m corral_dev.scripted --port 8090 --script demo.yaml &
    CORRAL_HARNESS_ADDR=127.0.0.1:8080 CORRAL_GRANTED_ROOT=$PWD CORRAL_STATE_DIR=/tmp/h \
        ANTHROPIC_BASE_URL=http://127.0.0.1:8090 corral-harness &
    curl -s -XPOST localhost:8080/agents/demo/c1 -d '{"message": "list the files",
        "agent": {"identity": "You are terse.", "model": "corral-scripted",
                  "tools": {"allow": ["bash"]}}}'
    curl -s 'localhost:8080/agents/demo/c1/updates?offset=0&wait=30'   # repeat from "offset"

The model engine is the lean httpx adapter; CORRAL_ENGINE=sdk runs the official SDK adapter
instead (its import slows the start: engine/choice.py, ADR 0014).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping

import uvicorn
from fastapi import FastAPI

from corral_common import logs
from corral_common.asgi import LISTEN_FD_ENV
from corral_common.catalog import check_catalog, window_of

from .adopt import gate_for
from .config import ConfigError, HarnessConfig
from .custodian_client.memory import CustodianMemory
from .hooks.runners import HookRunners
from .policy.turn_policy import CorralTurnPolicy, memory_per_scope
from .ports import Workspace
from .server import create_app, workspace_for


def build_policy(config: HarnessConfig, workspace: Workspace | None = None) -> CorralTurnPolicy:
    """The full policy: context assembly, permissions, hooks, and memory per agent.

    With a custodian, memory is the custodian's (it owns the store and its credentials); a
    harness started alone keeps a local file in its state directory."""
    memory = (
        CustodianMemory(config.custodian_url, credential=config.custodian_credential()).for_turn
        if config.custodian_url
        else memory_per_scope(config.state_dir / "memory.db")
    )
    workspace = workspace or workspace_for(config)
    return CorralTurnPolicy(
        granted_root=config.granted_root,
        workspace=workspace,
        read_only=config.read_only,
        window_lookup=window_of,
        memory=memory,
        # The Agent's spec.hooks: commands here or in the tools container, http via the custodian.
        hook_runner=HookRunners(
            workspace,
            custodian_url=config.custodian_url,
            credential=config.custodian_credential(),
        ),
    )


def make_app(config: HarnessConfig) -> FastAPI:
    """The wire app with the full policy; the tools and the path checks share one workspace."""
    workspace = workspace_for(config)
    return create_app(config, policy=build_policy(config, workspace), workspace=workspace)


def main() -> None:
    try:  # JSON lines carry the run id (docs/observability.md)
        logs.configure(logs.parse_format(os.environ.get(logs.LOG_FORMAT_ENV)), logging.INFO)
    except ValueError as exc:
        print(f"corral-harness: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    # The SDK's HTTP client logs every request at INFO; the metrics count them instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        config = HarnessConfig.from_env()
        check_catalog()  # a bad catalog overlay stops the process here, with its reason
        # A warm-pool pod waits for its Session behind the adopt gate (docs/warm-pool.md).
        app = gate_for(config, make_app) or make_app(config)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"corral-harness: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            log_config=None,  # uvicorn's lines go through the handler above, in its format
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    server.run(sockets=inherited_listener(os.environ))


def inherited_listener(env: Mapping[str, str]) -> list[socket.socket] | None:
    """The listening socket `corral run` bound and handed down (CORRAL_LISTEN_FD), if any:
    served as it is, so no other process can take its port first."""
    fd = env.get(LISTEN_FD_ENV, "").strip()
    if not fd:
        return None
    if not fd.isdigit():
        raise SystemExit(f"corral-harness: {LISTEN_FD_ENV} must be a file descriptor, not {fd!r}")
    sock = socket.socket(fileno=int(fd))
    sock.set_inheritable(False)  # the agent's commands never get it
    return [sock]


if __name__ == "__main__":
    main()
