"""`corral-harness`: serve the wire on CORRAL_HARNESS_ADDR (DESIGN §8).

By hand, against the scripted model::

    python -m corral_harness.scripted --port 8090 --script demo.yaml &
    CORRAL_HARNESS_ADDR=127.0.0.1:8080 CORRAL_GRANTED_ROOT=$PWD CORRAL_STATE_DIR=/tmp/h \
        ANTHROPIC_BASE_URL=http://127.0.0.1:8090 corral-harness &
    curl -s -XPOST localhost:8080/agents/demo/c1 -d '{"message": "list the files",
        "agent": {"identity": "You are terse.", "model": "corral-scripted",
                  "tools": {"allow": ["bash"]}}}'
    curl -s 'localhost:8080/agents/demo/c1/updates?offset=0&wait=30'   # repeat from "offset"
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from corral_common.catalog import window_of

from .config import ConfigError, HarnessConfig
from .policy.turn_policy import CorralTurnPolicy, memory_per_scope
from .seams import Workspace
from .server import create_app, workspace_for


def build_policy(config: HarnessConfig, workspace: Workspace | None = None) -> CorralTurnPolicy:
    """The full policy: context assembly, permissions, hooks, and memory per agent."""
    return CorralTurnPolicy(
        granted_root=config.granted_root,
        workspace=workspace,
        read_only=config.read_only,
        window_lookup=window_of,
        memory=memory_per_scope(config.state_dir / "memory.db"),
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The SDK's HTTP client logs every request at INFO; the metrics count them instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        config = HarnessConfig.from_env()
        workspace = workspace_for(config)  # the tools and the policy's path checks share it
        app = create_app(config, policy=build_policy(config, workspace), workspace=workspace)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"corral-harness: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
