"""`corral-custodian`: the sandbox pod's credential holder. Configured by environment:

CORRAL_CUSTODIAN_ADDR        host:port to listen on (default 127.0.0.1:8081)
CORRAL_UPSTREAM_URL          the real model endpoint (default https://api.anthropic.com)
ANTHROPIC_API_KEY or CORRAL_MODEL_KEY_FILE   the model key (the harness never has it)
CORRAL_SESSION_NAME / _NAMESPACE / _UID      the session this pod serves
CORRAL_BUDGET_TOKENS, CORRAL_BUDGET_COST     0 or unset: no budget
CORRAL_STATE_DIR             usage records (kept across restarts) and the push mirror
CORRAL_AGENT_SPEC_FILE or CORRAL_AGENT_SPEC_JSON   the Agent spec (caps, orchestrator)
CORRAL_KUBE_API, CORRAL_KUBE_TOKEN_FILE, CORRAL_KUBE_CA_FILE   the cluster; unset: none
CORRAL_GIT_CREDENTIALS_FILE  git credential-store file used for push and land
CORRAL_SESSION_BRANCH        the only branch push may target
CORRAL_WORKSPACE             the workspace whose HEAD push sends
CORRAL_GIT_REMOTE_URL        where to push (default: the workspace's origin, read at start)
CORRAL_LAND_CHECK            Evidence check that must Pass for a revision before land
CORRAL_READ_ONLY             1: no push, no land
"""

from __future__ import annotations

import argparse
import os
import sys

import uvicorn

from ._app import create_app
from .settings import SettingsError, from_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="corral-custodian",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    try:
        settings = from_env(os.environ)
    except SettingsError as e:
        print(f"corral-custodian: {e}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=os.environ.get("CORRAL_LOG_LEVEL", "warning"),
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
