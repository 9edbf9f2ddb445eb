"""The malicious-agent suite runs on the same real control plane and local node as the cluster
tier: the local node runs each container as its own uid in its own mount namespace, so what the
agent's shell cannot reach here it could not reach in a real pod either (egress, which the local
node does not police, is proved on the real node).

Every Agent the suite applies through `operator.apply` holds canary credentials (`canaries`):
a model key, a git credential, a hook secret (an http hook after every turn that sends it) and
the memory DSN of a real PostgreSQL whose password is the canary, each random per run. After
each test, and once after the whole suite (`test_canary_sweep.py`'s last test, moved after the
suite's other tests), the canary sweep (`_canary.py`) searches everything a party without those
credentials can read and fails the test with every finding.
"""

from __future__ import annotations

import contextlib
import http.server
import secrets
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from corral_dev import controlplane
from corral_dev.controlplane import ControlPlane
from tests._postgres import running_postgres
from tests.attack._canary import (
    GIT_CREDENTIAL,
    HOOK_SECRET,
    MEMORY_DSN,
    MODEL_KEY,
    Canary,
    Console,
    Places,
    Sweep,
    login_canary,
    report,
)
from tests.cluster._console_fixtures import person_token
from tests.cluster._node_fixtures import *  # noqa: F403
from tests.cluster._node_fixtures import TEST_REPOS, LocalNodeHandle
from tests.cluster._operator_fixtures import (  # noqa: F401
    OperatorExtras,
    OperatorHandle,
    ScriptedModelHandle,
    git_repo,
    operator,
    scripted_model,
)
from tests.cluster.conftest import control_plane, namespace  # noqa: F401

FINAL_SWEEP = "test_canary_sweep.py::test_no_canary_anywhere_after_the_whole_suite"
CANARY_HOOK = "canary-hook"
CANARY_VIEWER = "canary-viewer"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [i for i in items if here in Path(str(i.fspath)).parents]
    for item in ours:
        item.add_marker(pytest.mark.cluster)
    # The whole-suite sweep runs after every other test of the suite, wherever it was
    # collected and whatever order the files were given in.
    # (xdist may have suffixed each test's id with its group, "@attack", by now)
    final = [i for i in ours if i.nodeid.rsplit("@", 1)[0].endswith(FINAL_SWEEP)]
    if final and len(ours) > 1:
        items.remove(final[0])
        last = max(items.index(i) for i in ours if i is not final[0])
        items.insert(last + 1, final[0])


# -------------------------------------------------------------------------------- canaries


@dataclass(frozen=True)
class Canaries:
    model_key: Canary
    git_credential: Canary
    hook_secret: Canary
    memory_dsn: Canary

    def all(self) -> list[Canary]:
        return [self.model_key, self.git_credential, self.hook_secret, self.memory_dsn]


@dataclass
class HookCalls:
    """The canary hook's endpoint: what the custodian sent it."""

    url: str
    authorizations: list[str] = field(default_factory=list)


@pytest.fixture(scope="package")
def canary_hook_server() -> Iterator[HookCalls]:
    calls = HookCalls("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            calls.authorizations.append(self.headers.get("authorization") or "")
            body = b"{}"  # allow
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    calls.url = f"http://127.0.0.1:{server.server_address[1]}/corral/after-turn"
    try:
        yield calls
    finally:
        server.shutdown()


@pytest.fixture(scope="package")
def canary_memory_dsn() -> Iterator[str]:
    """A real PostgreSQL whose login is the memory canary; where PostgreSQL cannot run (and
    CORRAL_REQUIRE_NODE is unset), a DSN to a closed port, configured and mounted all the same."""
    password = f"canary-memory-{secrets.token_hex(10)}"
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_postgres())
        except pytest.skip.Exception as why:
            warnings.warn(f"the memory canary's DSN points nowhere: {why}", stacklevel=1)
            yield f"postgresql://corral:{password}@127.0.0.1:{controlplane.free_port()}/postgres"
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE corral PASSWORD {}").format(sql.Literal(password)))
        yield f"postgresql://corral:{password}@127.0.0.1:{server.port}/postgres"


@pytest.fixture(scope="package")
def canaries(canary_memory_dsn: str) -> Canaries:
    token = f"canary-git-{secrets.token_hex(10)}"
    return Canaries(
        model_key=Canary.plain(MODEL_KEY, f"canary-model-{secrets.token_hex(10)}"),
        git_credential=login_canary(
            GIT_CREDENTIAL, f"https://corral-canary:{token}@git.canary.invalid"
        ),
        hook_secret=Canary.plain(HOOK_SECRET, f"canary-hook-{secrets.token_hex(10)}"),
        memory_dsn=login_canary(MEMORY_DSN, canary_memory_dsn),
    )


# ------------------------------------------------------------------------------- the sweep


@pytest.fixture(scope="package")
def canary_places(
    control_plane: ControlPlane,  # noqa: F811
    local_node: LocalNodeHandle,
    scripted_model: ScriptedModelHandle,  # noqa: F811
) -> Iterator[Places]:
    archive = Path(tempfile.mkdtemp(prefix="corral-attack-archive-"))
    try:
        yield Places(
            control_plane,
            node_workdir=local_node.workdir,
            repos=[TEST_REPOS],
            model_urls=[scripted_model.url],
            archives=[archive],
        )
    finally:
        shutil.rmtree(archive, ignore_errors=True)


@pytest.fixture(scope="package")
def canary_sweep(canaries: Canaries, canary_places: Places) -> Iterator[Sweep]:
    sweep = Sweep(canaries.all(), canary_places)
    try:
        yield sweep
    finally:
        sweep.close()


@pytest.fixture(autouse=True)
def _sweep_after_each_test(request: pytest.FixtureRequest, canary_sweep: Sweep) -> Iterator[None]:
    """The sweep after the test, before its operator, repository and namespace go: they are
    set up first here, so they are torn down after this fixture."""
    for name in ("operator", "git_repo", "console"):
        if name in request.fixturenames:
            request.getfixturevalue(name)
    yield
    findings = canary_sweep.new_findings()
    if findings:
        pytest.fail(report(findings, title="canary sweep after the test"), pytrace=False)


# ---------------------------------------------------------------- the canaries in Sessions


@pytest.fixture(scope="package")
def operator_extras(
    canaries: Canaries, canary_hook_server: HookCalls, canary_places: Places
) -> Iterator[OperatorExtras]:
    """Every attack operator: its console (read by the sweep as a viewer), the suite's archive
    and the memory DSN; every Agent: the canary model key, git credential and hook secret."""
    state = Path(tempfile.mkdtemp(prefix="corral-attack-operator-"))
    dsn_file = state / "memory-dsn"
    dsn_file.write_text(canaries.memory_dsn.value + "\n")
    dsn_file.chmod(0o600)

    def args() -> list[str]:
        return [
            "--console-addr", f"127.0.0.1:{controlplane.free_port()}",
            "--archive-dir", str(canary_places.archives[0]),
            "--memory-dsn-file", str(dsn_file),
        ]  # fmt: skip

    def started(handle: OperatorHandle) -> None:
        canary_places.files.append(handle.log)
        release = f"corral-{handle.namespace}"
        token = person_token(handle.cp, handle.namespace, CANARY_VIEWER, f"{release}-viewer")

        def url() -> str | None:
            if handle.process is None or handle.process.poll() is not None:
                return None
            addrs = [a for i, a in enumerate(handle.args) if handle.args[i - 1] == "--console-addr"]
            return f"http://{addrs[-1]}" if addrs else None

        canary_places.consoles.append(Console(url, token, handle.namespace))

    def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "stringData": data,
        }

    yield OperatorExtras(
        args=args,
        secrets=[
            secret("canary-model", {"apiKey": canaries.model_key.value}),
            secret("canary-git", {"credentials": canaries.git_credential.value + "\n"}),
            secret("canary-hooks", {"token": canaries.hook_secret.value}),
        ],
        credentials={
            "modelSecretRef": {"name": "canary-model", "key": "apiKey"},
            "gitSecretRef": {"name": "canary-git", "key": "credentials"},
            "hookSecretRef": {"name": "canary-hooks"},
        },
        hooks={
            "afterTurn": [
                {
                    "name": CANARY_HOOK,
                    "http": {
                        "url": canary_hook_server.url,
                        "headers": [
                            {"name": "Authorization", "secretKey": "token", "prefix": "Bearer "}
                        ],
                    },
                    "timeoutSeconds": 10,
                    "onError": "allow",
                }
            ]
        },
        started=started,
    )
    shutil.rmtree(state, ignore_errors=True)
