"""`corral run`: one Session on this machine, with no cluster.

The same harness and custodian as in a sandbox pod run here as local processes on loopback
ports, with the workspace as the granted root, and the operator's own turn driver drives the
turns through the wire. Exit codes: 0 the session succeeded; 1 it did not (the reason is
printed); 2 the input is invalid, or anything else went wrong (`_errors`); 130 interrupted (the
turn was aborted through the wire), at any moment, teardown included (`_runcontrol`). The state
directory is the run's alone while it runs (`_runcontrol.lock_state_dir`). With --json the last
line of stdout is one object: the outcome, the answer, the commit and the error, if any.
Children an orchestrator starts run the same way, each as its own `LocalRun` (`_children`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from corral_api import Agent, Session
from corral_api.kinds import SessionOverrides, SessionSpec
from corral_api.providers import ModelProvider, ProviderError, choose_provider, load_providers
from corral_common.branches import default_session_branch
from corral_harness.telemetry import ENDPOINT_ENV, TRACES_ENDPOINT_ENV, traces_endpoint
from corral_operator.driver import (
    WAITING_FOR_WAKE,
    DriverOutcome,
    SessionDriver,
    WireFault,
    children_report,
    seconds_until_wake,
)
from corral_operator.planning.lineage import out_of_turns_message, with_turn_cap
from corral_operator.wireclient import WireClient

from . import _processes as proc
from ._approvals import MODES, ApprovalDesk, default_mode
from ._children import SessionTree, TreeTurnStore
from ._egress_local import (
    GATEWAY_ENV,
    LocalGateway,
    LocalGatewayError,
    find_gateway,
    start_local_gateway,
)
from ._errors import DEBUG_ENV, CommandError, Parser, exit_epilog, explain, report
from ._localpaths import MEMORY_ENV, default_run_dir, is_inside, memory_db, write_secret
from ._localstore import STATE_FILE, RunRecord
from ._manifests import (
    ManifestError,
    check_session_branch,
    load_manifests,
    manifest_dir,
    pick_session,
)
from ._providers_local import provider_env
from ._run_flags import add_run_flags, dry_run_text, inline_session, with_flags
from ._runcontrol import Interrupts, StateLock, lock_state_dir
from ._view import View, choose_view
from ._workspace import (
    SessionCheckout,
    WorkspaceError,
    current_branch,
    dirty_message,
    dirty_paths,
    prepare_workspace,
    repository_top,
    worktree_checkout,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_INTERRUPTED = 130

SCRIPTED_MODEL = "corral-scripted"
SCENARIO_ENV = "CORRAL_DEMO_SCENARIO"
# The custodian's trace relay (corral_custodian/_otlp.py), where the harness's spans go.
OTLP_RELAY_PATH = "/otlp/v1/traces"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
# What the harness and the custodian import to start: the `sandbox` extra (pyproject.toml).
# Looked for (not imported) before anything starts, so a missing one is named, not a part that
# dies at its start with an ImportError in its log.
SANDBOX_MODULES = ("anthropic", "httpx", "fastapi", "starlette", "uvicorn", "prometheus_client")
SANDBOX_EXTRA = "pip install 'corral[sandbox]'"


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or Parser(prog="corral run")
    p.epilog = exit_epilog("the session did not succeed (the reason is printed)")
    p.description = (
        "Run one Session locally: the harness and custodian as local processes, the turns "
        "driven through the wire as the operator drives them."
    )
    p.add_argument(
        "-f",
        "--filename",
        dest="files",
        metavar="FILE",
        action="append",
        type=Path,
        default=[],
        help="YAML (or JSON) with the Session and optionally its Agent: a file, - for stdin, "
        "or a directory (its *.yaml, *.yml, *.json); may be given more than once",
    )
    p.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="a -f directory's subdirectories too",
    )
    p.add_argument(
        "--agent",
        dest="agent_files",
        metavar="FILE",
        action="append",
        type=Path,
        default=[],
        help="YAML with the Agent the Session names",
    )
    p.add_argument(
        "--workspace",
        metavar="DIR",
        type=Path,
        help="the repository (or a directory in one) the agent works on: in a worktree of it "
        "under the state directory, on the session branch made from HEAD, so your checkout "
        "is left as it is (a directory outside git is worked in directly); default: a clone "
        "of spec.workspace.repo under the state directory",
    )
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run although --workspace has uncommitted changes or untracked files (the agent "
        "starts from the last commit without them; they stay where they are)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        type=Path,
        help="where state, ledger, transcript, logs and secrets go, never inside the "
        "workspace; default $XDG_STATE_HOME/corral/runs/<name>-<time> (else "
        "~/.local/state/corral/runs/...)",
    )
    p.add_argument(
        "--output-schema",
        metavar="FILE",
        type=Path,
        help="JSON Schema (JSON or YAML) the final answer must satisfy; replaces the Session's "
        "spec.outputSchema, and the validated object is printed at the end",
    )
    p.add_argument(
        "--egress",
        choices=("auto", "gateway", "off"),
        default="auto",
        help="the Agent's sandbox.egress through a local corral-gateway: gateway (required), "
        "off, or auto (the default: when the Agent names egress rules and corral-gateway is "
        "found). Without root a command that ignores the proxy variables is not stopped "
        "(docs/egress.md)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line; the last is the outcome (outcome, answer, commit, error)",
    )
    p.add_argument(
        "--approvals",
        choices=MODES,
        help="how to answer the harness's requests for a human decision: ask (a prompt; the "
        "default on a terminal), approve, deny (the default otherwise), or manual",
    )
    p.add_argument(
        "--scenario",
        metavar="FILE",
        type=Path,
        help="script for the scripted model when no ANTHROPIC_API_KEY is set "
        f"(default: ${SCENARIO_ENV}, else examples/demo/scenario.yaml)",
    )
    p.add_argument(
        "--providers",
        metavar="FILE",
        type=Path,
        help="the model providers (JSON or YAML, as the chart's modelProviders; "
        "docs/providers.md): the Agent's spec.provider picks one, and its credential comes "
        "from this shell (ANTHROPIC_API_KEY; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
        "AWS_SESSION_TOKEN or AWS_WEB_IDENTITY_TOKEN_FILE; GOOGLE_APPLICATION_CREDENTIALS), "
        "for the custodian alone",
    )
    add_run_flags(p)
    return p


@dataclass
class ModelRoute:
    upstream: str  # where the custodian sends model calls
    key: str | None
    model_override: str | None
    scripted: bool
    provider: ModelProvider | None = None  # the Agent's, from --providers (docs/providers.md)

    def destinations(self) -> list[str]:
        return self.provider.destinations() if self.provider is not None else [self.upstream]


def _providers(args: argparse.Namespace, agent: Agent) -> ModelProvider | None:
    """The provider the Agent names among --providers (or their default); None without the
    flag, when the Agent names none."""
    path: Path | None = getattr(args, "providers", None)
    if path is None:
        if agent.spec.provider is not None:
            raise ManifestError(
                f"the Agent names provider {agent.spec.provider!r}: pass --providers FILE "
                "with the platform's modelProviders (docs/providers.md)"
            )
        return None
    try:
        listed = load_providers(path.read_text(), f"--providers {path}")
    except OSError as e:
        raise ManifestError(f"--providers {path}: {e.strerror or e}") from e
    except ProviderError as e:
        raise ManifestError(str(e)) from e
    try:
        return choose_provider(listed, agent.spec.provider, "https://api.anthropic.com")
    except ProviderError as e:
        raise ManifestError(f"--providers {path}: {e}") from e


def _scenario(args: argparse.Namespace) -> Path:
    if args.scenario is not None:
        if not args.scenario.is_file():
            raise ManifestError(f"--scenario {args.scenario}: no such file")
        return Path(args.scenario).resolve()
    from_env = os.environ.get(SCENARIO_ENV)
    candidates = [Path(from_env)] if from_env else []
    candidates += [manifest_dir(f) / "demo" / "scenario.yaml" for f in args.files]
    candidates.append(_PROJECT_ROOT / "examples" / "demo" / "scenario.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ManifestError(
        "no ANTHROPIC_API_KEY is set and no scenario for the scripted model was found; "
        "pass --scenario FILE or set ANTHROPIC_API_KEY"
    )


def memory_file() -> Path:
    """The memory store of `corral run` (docs/memory.md): $CORRAL_MEMORY_SQLITE, else one
    database under the state home for every run started from this directory."""
    return memory_db()


class LocalRun:
    """The processes and the driver of one `corral run`."""

    def __init__(
        self,
        args: argparse.Namespace,
        session: Session,
        agent: Agent,
        view: View,
        *,
        agents: dict[str, Agent] | None = None,
        parent: LocalRun | None = None,
        state_dir: Path | None = None,
        max_turns: int | None = None,
    ) -> None:
        self.args = args
        self.session = session
        self.view = view
        self.name = str(session.metadata["name"])
        self.state_dir: Path = (state_dir or args.state_dir or default_run_dir(self.name)).resolve()
        # The turn cap the operator's rules derive (a child's: what its parent has left).
        self.max_turns = agent.spec.limits.max_turns if max_turns is None else max_turns
        self.agent = agent.model_copy(update={"spec": with_turn_cap(agent.spec, self.max_turns)})
        self.parts = proc.Parts(self.state_dir / "logs")
        self.driver: SessionDriver | None = None
        self.interrupted = False
        self._token = ""
        self._abort_task: asyncio.Task[None] | None = None
        # The session tree (docs/children.md): the root makes it, its children share it.
        self.parent = parent
        self.route: ModelRoute | None = parent.route if parent is not None else None
        self.tree: SessionTree = (
            parent.tree
            if parent is not None
            else SessionTree(self.state_dir / "sessions", agents or {}, view, self._run_child)
        )
        self.uid = ""
        self.children: list[LocalRun] = []
        self.gateway: LocalGateway | None = None

    @property
    def root(self) -> LocalRun:
        return self if self.parent is None else self.parent.root

    def _emit(self, event: dict[str, Any]) -> None:
        """An event to the view; a child's carry its name (the view shows it as a child's)."""
        self.view.event(event if self.parent is None else {**event, "session": self.name})

    async def _run_child(
        self, session: Session, agent: Agent, max_turns: int, workspace: Path, state_dir: Path
    ) -> str:
        """One child of the tree, run to its end as this run is: its own processes."""
        parent_name = str(session.spec.parent_ref.name if session.spec.parent_ref else "")
        parent = self._find(parent_name) or self
        child = LocalRun(
            self.args, session, agent, self.view, parent=parent, state_dir=state_dir,
            max_turns=max_turns,
        )  # fmt: skip
        parent.children.append(child)
        try:
            outcome = await child.drive(workspace)
        finally:
            child.parts.stop()
        return outcome.phase

    def _find(self, name: str) -> LocalRun | None:
        if self.name == name:
            return self
        for child in self.children:
            found = child._find(name)
            if found is not None:
                return found
        return None

    def stop_all(self) -> None:
        """Stop this run's processes and every child's."""
        for child in self.children:
            child.stop_all()
        self.parts.stop()
        if self.gateway is not None:
            self.gateway.stop()

    def kill_all(self) -> None:
        """A Ctrl-C while the run stops: every process of it (children's too) killed now."""
        for child in self.children:
            child.kill_all()
        self.parts.kill()
        if self.gateway is not None:
            self.gateway.kill()

    def running_parts(self) -> bool:
        return bool(self.parts.running) or any(c.running_parts() for c in self.children)

    def egress_note(self) -> str | None:
        """The gateway's decisions for this run, in a line; None without a gateway."""
        records = self.gateway.records(self.name) if self.gateway is not None else None
        if records is None:
            return None
        hosts = records.get("hosts") or []
        denied = sorted({f"{h['host']}:{h['port']}" for h in hosts if h["decision"] == "denied"})
        allowed = sum(int(h["count"]) for h in hosts if h["decision"] == "allowed")
        text = f"egress: {allowed} allowed"
        if denied:
            text += f", denied {', '.join(denied[:10])}" + (" ..." if len(denied) > 10 else "")
        return text

    def _route(self) -> ModelRoute:
        if self.route is not None:
            return self.route  # a child: the model its root runs against
        key = os.environ.get("ANTHROPIC_API_KEY") or None
        provider = _providers(self.args, self.agent)
        if provider is not None:
            where = provider.destinations()[-1]
            return ModelRoute(where, key, None, scripted=False, provider=provider)
        if key:
            base = os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
            return ModelRoute(base.rstrip("/"), key, None, scripted=False)
        return ModelRoute("", None, SCRIPTED_MODEL, scripted=True)

    async def _start(self, workspace: Path, route: ModelRoute) -> str:
        """Start the model (when scripted), the custodian and the harness; the harness's URL."""
        if route.scripted and not route.upstream:
            route.upstream = await self._start_scripted_model()
        else:
            through = f" (provider {route.provider.name})" if route.provider else ""
            self.view.note(f"model: {self.agent.spec.model} at {route.upstream}{through}")
        # Started together, as a pod's containers are: the custodian's start-up is then not
        # added to the time to the first model request; a turn is admitted once both answer.
        gateway = self._start_gateway(route)
        custodian = self._start_custodian(workspace, route, gateway)
        harness = self._start_harness(workspace, custodian.url, gateway)
        await asyncio.gather(self.parts.wait_ready(custodian), self.parts.wait_ready(harness))
        return harness.url

    async def _start_scripted_model(self) -> str:
        scenario = _scenario(self.args)
        port = proc.free_port()
        argv = proc.scripted_argv(port, scenario)
        model = self.parts.start("scripted-model", argv, proc.base_env(), port)
        await self.parts.wait_ready(model, "/_requests")
        self.view.note(f"model: the scripted demo model playing {scenario}")
        return model.url

    def _start_gateway(self, route: ModelRoute) -> LocalGateway | None:
        """The Agent's egress rules through a local gateway (docs/egress.md, "corral run")."""
        mode = getattr(self.args, "egress", "auto")
        rules = self.agent.spec.sandbox.egress
        if mode == "off" or (mode == "auto" and not rules):
            return None
        binary = find_gateway()
        if binary is None:
            if mode == "gateway":
                raise proc.StartFailed(
                    "--egress gateway: corral-gateway was not found (`make gateway` builds it; "
                    f"or set {GATEWAY_ENV})"
                )
            self.view.note(
                "egress: not enforced (corral-gateway not found; `make gateway` builds it)"
            )
            return None
        try:
            gateway = start_local_gateway(
                binary,
                self.state_dir,
                self.agent,
                self.name,
                route.destinations(),
                self.session.spec.workspace.repo,
                collector=traces_endpoint(os.environ),
            )
        except LocalGatewayError as exc:
            raise proc.StartFailed(str(exc)) from exc
        self.gateway = gateway
        names = ", ".join(r.host or str(r.cidr) for r in rules) or "nothing"
        self.view.note(
            f"egress: through a local gateway; the agent's commands reach {names} (a command "
            "that ignores HTTPS_PROXY is not stopped without root)"
        )
        return gateway

    def _start_custodian(
        self, workspace: Path, route: ModelRoute, gateway: LocalGateway | None = None
    ) -> proc.Part:
        """The custodian holds the model key; nothing else in the run is given it."""
        spec = self.session.spec
        listener = proc.listening_socket()
        port = listener.getsockname()[1]
        env = proc.base_env() | {
            "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{port}",
            "CORRAL_UPSTREAM_URL": route.upstream,
            "CORRAL_SESSION_NAME": self.name,
            "CORRAL_SESSION_NAMESPACE": "local",
            "CORRAL_SESSION_UID": self.uid or str(uuid.uuid4()),
            # The session tree: spawn_child writes a child there, `corral run` runs it.
            "CORRAL_LOCAL_SESSIONS_DIR": str(self.tree.files.directory),
            "CORRAL_STATE_DIR": str(self.state_dir / "custodian"),
            "CORRAL_AGENT_SPEC_JSON": json.dumps(self.agent.spec.wire()),
            "CORRAL_AGENT_NAME": spec.agent_ref,  # the default memory scope
            # Long-term memory outlives the run: one file for every run from this directory.
            "CORRAL_MEMORY_SQLITE": str(memory_file()),
        }
        # base_env drops CORRAL_*: the embedder choice (docs/memory.md) is passed on by name.
        if embedder := os.environ.get("CORRAL_MEMORY_EMBEDDER"):
            env["CORRAL_MEMORY_EMBEDDER"] = embedder
        if route.provider is not None:
            env |= provider_env(route.provider, self.state_dir / "secrets")
        if route.key and (
            route.provider is None or route.provider.type in ("anthropic", "gateway")
        ):
            key_file = write_secret(self.state_dir / "secrets" / "model-key", route.key)
            env["CORRAL_MODEL_KEY_FILE"] = str(key_file)
        # The session's own branch, as the operator names it: delivery records it (and a
        # child starts from what was delivered, docs/children.md).
        env["CORRAL_SESSION_BRANCH"] = spec.workspace.branch or f"corral/{self.name}"
        if spec.read_only:
            env["CORRAL_READ_ONLY"] = "1"
        # The custodian allows the Agent's model and this Session's override, nothing else.
        override = route.model_override or (spec.overrides.model if spec.overrides else None)
        if override:
            env["CORRAL_MODEL_OVERRIDE"] = override
        # The push remote is pinned here, never read from the agent-writable checkout; a local
        # path is not a remote the custodian will push to (it refuses file:// and paths).
        if "://" in spec.workspace.repo:
            env["CORRAL_GIT_REMOTE_URL"] = spec.workspace.repo
        if gateway is not None:
            env |= gateway.custodian_env()
        # This shell's collector (OTEL_EXPORTER_OTLP_*), reached by the custodian alone, as in
        # a pod: the harness's spans come through its relay (docs/tracing.md).
        if collector := traces_endpoint(os.environ):
            env["CORRAL_OTLP_TRACES_ENDPOINT"] = collector
        return self.parts.start("custodian", proc.part_argv(proc.CUSTODIAN), env, listener=listener)

    def _start_harness(
        self, workspace: Path, custodian_url: str, gateway: LocalGateway | None = None
    ) -> proc.Part:
        self._token = secrets.token_urlsafe(32)
        token_file = write_secret(self.state_dir / "secrets" / "wire-token", self._token)
        listener = proc.listening_socket()
        port = listener.getsockname()[1]
        # The collector is the custodian's to reach; the harness exports to the relay.
        env = proc.base_env(drop=(ENDPOINT_ENV, TRACES_ENDPOINT_ENV)) | {
            "CORRAL_HARNESS_ADDR": f"127.0.0.1:{port}",
            "CORRAL_STATE_DIR": str(self.state_dir / "harness"),
            "CORRAL_GRANTED_ROOT": str(workspace),
            "CORRAL_WIRE_TOKEN_FILE": str(token_file),
            "CORRAL_READ_ONLY": "1" if self.session.spec.read_only else "",
            "CORRAL_CUSTODIAN_URL": custodian_url,
            "ANTHROPIC_BASE_URL": custodian_url,
        }
        if traces_endpoint(os.environ):
            env[TRACES_ENDPOINT_ENV] = custodian_url + OTLP_RELAY_PATH
        if gateway is not None:
            # The harness's children (the agent's commands) inherit them: no credential.
            env |= gateway.tools_env()
        return self.parts.start("harness", proc.part_argv(proc.HARNESS), env, listener=listener)

    async def drive(self, workspace: Path) -> DriverOutcome:
        route = self._route()
        spec = self.session.spec
        if route.model_override:
            current = spec.overrides or SessionOverrides()
            spec = spec.model_copy(
                update={"overrides": current.model_copy(update={"model": route.model_override})}
            )
        watch: asyncio.Task[None] | None = None
        if self.parent is None:
            self.uid = str(self.tree.add_root(self.session, workspace)["metadata"]["uid"])
            # The operator's watch, for children: it costs a directory listing per tick.
            watch = asyncio.get_running_loop().create_task(self.tree.watch())
        else:
            self.uid = str(self.session.metadata.get("uid") or "")
        try:
            return await self._drive(workspace, route, spec)
        finally:
            if watch is not None:
                watch.cancel()
                await self.tree.stop()

    async def _drive(self, workspace: Path, route: ModelRoute, spec: SessionSpec) -> DriverOutcome:
        harness_url = await self._start(workspace, route)
        record = RunRecord(self.state_dir)
        desk = ApprovalDesk(
            # The custodian's gate keeps them: it has no cluster here (docs/approvals.md).
            self.state_dir / "custodian" / "approvals",
            self.args.approvals or default_mode(self.args.json),
            self.view.note,
            self.view.prompt,
        )

        def on_event(event: dict[str, Any]) -> None:
            record.record(event)
            self._emit(event)
            desk.on_event(event)

        client = WireClient(harness_url, spec.agent_ref, token=self._token)
        async with client:
            store = TreeTurnStore(
                self.state_dir, self.tree, self.name, self.uid, child=self.parent is not None
            )
            self.driver = SessionDriver(client, store, self.agent.spec, spec, self.name, on_event)
            try:
                outcome = await self.driver.run()
                while outcome.phase == WAITING_FOR_WAKE:
                    # The one-shot wake (docs/wake.md): wait here, then the driver admits it;
                    # after a Ctrl-C the driver records the session Stopped instead.
                    due = seconds_until_wake(await store.load(), datetime.now(UTC))
                    self.view.note(f"waiting {due:.0f}s for the one-shot wake…")
                    deadline = time.monotonic() + due
                    while not self.interrupted and time.monotonic() < deadline:
                        await asyncio.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
                    outcome = await self.driver.run()
                while outcome.phase == "WaitingForChildren" and not self.interrupted:
                    # Children (docs/children.md): resume by the wait mode, with one line per
                    # finished child, within the turns this session has (the operator's rules).
                    state = await store.load()
                    await self.tree.until_satisfied(self.uid, state, lambda: self.interrupted)
                    if self.interrupted:
                        break
                    if state.turns >= self.max_turns:
                        state.phase, state.finished_at = "Failed", None
                        state.message = out_of_turns_message(state.turns, self.max_turns)
                        await store.save(state)
                        self._emit(
                            {"source": "driver", "type": "finished", "phase": "Failed",
                             "message": state.message}
                        )  # fmt: skip
                        return DriverOutcome("Failed", state.message, state.turns, state.usage)
                    report = children_report(
                        state.waiting_for,
                        self.tree.files.children_of(self.uid),
                        state.reported_children,
                    )
                    self.driver = SessionDriver(
                        client, store, self.agent.spec, spec, self.name, on_event,
                        children_report=report,
                    )  # fmt: skip
                    outcome = await self.driver.run()
                while outcome.phase == "WaitingForHuman" and not self.interrupted:
                    # A turn asked a question (docs/turns.md): the person answers here, as
                    # `corral reply` does on a cluster, and the next turn starts from it.
                    reply = await self._reply((await store.load()).question)
                    if not reply:
                        break
                    spec = spec.model_copy(update={"replies": [*spec.replies, reply]})
                    self.driver = SessionDriver(
                        client, store, self.agent.spec, spec, self.name, on_event
                    )
                    outcome = await self.driver.run()
                return outcome
            finally:
                desk.cancel()

    async def _reply(self, question: str | None) -> str:
        """A person's answer on the terminal; empty when there is no question or no terminal."""
        if question is None:
            return ""
        try:
            answer = await asyncio.to_thread(self.view.prompt, f"{question}\nreply> ")
        except EOFError:
            return ""
        return answer.strip()

    def on_interrupt(self) -> None:
        """The first Ctrl-C: abort the turn through the wire and let the driver record it."""
        if self.driver is None or self.interrupted:
            return
        self.interrupted = True
        self.view.note("interrupted: aborting the turn in flight through the wire…")
        self._abort_task = asyncio.get_running_loop().create_task(self._abort(self.driver))

    async def _abort(self, driver: SessionDriver) -> None:
        try:
            await driver.abort()
        except Exception as exc:  # the harness gone already: the driver records what it can
            self.view.note(f"the abort did not reach the harness: {type(exc).__name__}: {exc}")


async def _main(run: LocalRun, workspace: Path, interrupts: Interrupts) -> DriverOutcome:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()

    def interrupt() -> None:
        if (run.interrupted or run.driver is None) and main_task is not None:
            # Still starting (nothing admitted, nothing to abort), or a second Ctrl-C: stop
            # waiting for the settlement.
            run.interrupted = True
            main_task.cancel()
            return
        run.on_interrupt()

    interrupts.running(loop, interrupt)
    try:
        return await run.drive(workspace)
    finally:
        interrupts.tearing_down()


def missing_sandbox_modules() -> list[str]:
    """The sandbox extra's modules this Python cannot import (looked for, not imported)."""
    missing = []
    for name in SANDBOX_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder refused it, or a broken half-install
            found = False
        if not found:
            missing.append(name)
    return missing


def run_command(argv: list[str], *, program: bool = False) -> int:
    """`corral run`; `program` when it is the process's entry point (Ctrl-C stays latched until
    the process exits, so a late one cannot print a traceback)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.files and args.task is None:
        parser.error("the following arguments are required: -f/--filename")  # or --task
    if args.output is not None and not args.dry_run:
        parser.error("-o prints what --dry-run would run; a run's own output is --json")
    missing = [] if args.dry_run else missing_sandbox_modules()
    if missing:
        raise CommandError(
            f"corral run starts the harness and the custodian here, and they need "
            f"{', '.join(missing)}, which this Python cannot import",
            f"install the sandbox extra: {SANDBOX_EXTRA}",
        )
    try:
        found = load_manifests([*args.agent_files, *args.files], recursive=args.recursive)
        if not args.files:
            found.sessions.append(inline_session(args, found))
        search = list(dict.fromkeys(manifest_dir(f) for f in args.files))
        session, agent = pick_session(found, search)
        session, agent = with_flags(args, session, agent)
        found.agents[session.spec.agent_ref] = agent
        check_session_branch(session, agent)
        if args.output_schema is not None:
            session = with_output_schema(session, args.output_schema)
        if args.scenario is not None and not args.scenario.is_file():
            raise ManifestError(f"--scenario {args.scenario}: no such file")
    except ManifestError as exc:
        json_output = args.json or args.output == "json"
        return report("corral run", str(exc), json_output=json_output, code=EXIT_INVALID)
    if args.dry_run:
        print(dry_run_text(session, agent, args.output))
        return EXIT_OK
    name = str(session.metadata["name"])
    view = choose_view(f"corral run · {name}", json_lines=args.json)
    run = LocalRun(args, session, agent, view, agents=found.agents)
    locks: list[StateLock] = []
    try:
        with Interrupts(run.kill_all, keep=program) as interrupts:
            return _run(args, run, view, found.ignored, interrupts, locks)
    finally:
        for lock in locks:
            lock.release()


@dataclass
class _Ending:
    """How a run ended short of an outcome: its exit status and its error, if any."""

    code: int = EXIT_FAILED
    error: tuple[str, str | None] | None = None


def _run(
    args: argparse.Namespace,
    run: LocalRun,
    view: View,
    ignored: list[str],
    interrupts: Interrupts,
    locks: list[StateLock],
) -> int:
    outcome: DriverOutcome | None = None
    ending = _Ending()
    with view:
        for each in ignored:
            view.note(f"{each} is not run locally; ignored")
        view.note(f"state directory: {run.state_dir}")
        checkout: SessionCheckout | None = None
        try:
            if args.workspace is not None and not args.workspace.is_dir():
                raise WorkspaceError(f"--workspace {args.workspace} is not a directory")
            make_checkout = _checkout(args, run)
            # Before anything is written there: a second run on it is refused, not mixed in.
            named = "--state-dir" if args.state_dir is not None else "the state directory"
            locks.append(lock_state_dir(run.state_dir, named))
            checkout = make_checkout()
            workspace = checkout.root
            where = f" (a worktree of {checkout.repository})" if checkout.worktree else ""
            on = f", on {checkout.branch}" if checkout.branch else ""
            view.note(f"workspace: {workspace}{where}{on}")
            interrupts.starting()
            outcome = asyncio.run(_main(run, workspace, interrupts))
        except (WorkspaceError, ManifestError) as exc:
            ending = _Ending(EXIT_INVALID, (str(exc), None))
        except proc.StartFailed as exc:
            ending.error = (str(exc), None)
        except WireFault as exc:
            ending.error = (f"the harness refused: {exc}", None)
        except (KeyboardInterrupt, asyncio.CancelledError):
            ending.code = EXIT_INTERRUPTED
        except Exception as exc:  # still a clean teardown, then the contract's line
            if os.environ.get(DEBUG_ENV):
                traceback.print_exc()
            ending = _Ending(EXIT_INVALID, explain(exc) or (
                f"internal error: {type(exc).__name__}: {exc}; rerun with {DEBUG_ENV}=1 for "
                "the traceback", None))  # fmt: skip
        finally:
            interrupts.tearing_down()
            if run.running_parts():
                view.note("stopping the local parts (a Ctrl-C kills them at once)…")
            if (egress := run.egress_note()) is not None:
                view.note(egress)
            run.stop_all()
        code = ending.code
        if outcome is not None:
            code = EXIT_OK if outcome.succeeded else EXIT_FAILED
        if interrupts.received or run.interrupted:
            code = EXIT_INTERRUPTED  # a Ctrl-C at any moment, the teardown's included
        record = _outcome_record(args, run, view, checkout, outcome, ending, code, bool(locks))
        if record is not None:
            view.outcome(record)
    if outcome is not None and outcome.output is not None and not args.json:
        # The structured answer last, alone, so a script can take it from stdout.
        print(json.dumps(outcome.output, indent=2, ensure_ascii=False))
    return code


def _outcome_record(
    args: argparse.Namespace,
    run: LocalRun,
    view: View,
    checkout: SessionCheckout | None,
    outcome: DriverOutcome | None,
    ending: _Ending,
    code: int,
    ours: bool,
) -> dict[str, Any] | None:
    """The notes on the commit and the record, the error's lines, then the outcome line's
    record (the last line of stdout under --json); None for an error in text mode (its lines on
    stderr say it). `ours`: the state directory was this run's (locked), so what is in it is
    this run's record."""
    committed: dict[str, Any] = {}
    if checkout is not None and checkout.branch is not None:
        revision = checkout.committed()
        committed = {"branch": checkout.branch, "committed": revision, "commit": revision}
        if revision is not None:
            view.note(f"committed {revision} on {checkout.branch}")
        else:
            view.note(f"nothing committed on {checkout.branch}")
        if outcome is not None and outcome.phase in FINAL_PHASES and checkout.release():
            view.note(f"worktree removed: `git switch {checkout.branch}` to check it out")
    if ours and (run.state_dir / STATE_FILE).exists():
        view.note(f"record: {run.state_dir} (state.json, ledger.jsonl, transcript.jsonl)")
    if ending.error is not None:
        report("corral run", *ending.error, json_output=False, code=code)
    base: dict[str, Any] = {
        "commit": None,
        **committed,
        "stateDir": str(run.state_dir),
        "exitCode": code,
    }
    if outcome is not None:
        return {
            "outcome": outcome.phase,
            "phase": outcome.phase,
            "message": outcome.message,
            "answer": outcome.text or None,
            "error": None,
            "turns": outcome.turns,
            "usage": outcome.usage.wire(),
            **base,
            **({"output": outcome.output} if outcome.output is not None else {}),
        }
    if code == EXIT_INTERRUPTED and ending.error is None:
        message = (
            "stopped without waiting for a settlement; `corral run` with the same --state-dir "
            "picks up from state.json (re-attaching to a turn in its ledger)"
        )
        return {"outcome": "Interrupted", "phase": _recorded_phase(run.state_dir, ours),
                "message": message, "answer": None, "error": None, **base}  # fmt: skip
    if not args.json:
        return None
    message, hint = ending.error or ("the run ended without an outcome", None)
    return {
        "outcome": "Error",
        "phase": _recorded_phase(run.state_dir, ours),
        "message": message,
        "answer": None,
        "error": {"message": message, **({"hint": hint} if hint else {})},
        **base,
    }


def _recorded_phase(state_dir: Path, ours: bool) -> str | None:
    """The phase state.json records, if the run got as far as writing it."""
    if not ours:
        return None
    try:
        phase = json.loads((state_dir / STATE_FILE).read_text()).get("phase")
    except (OSError, ValueError, AttributeError):
        return None
    return str(phase) if phase else None


# A run that ended so is not resumed: its worktree may go (a Stopped one may be picked up).
FINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _checkout(args: argparse.Namespace, run: LocalRun) -> Callable[[], SessionCheckout]:
    """How to make where the agent works and the branch its commits go on, once every check
    has passed (nothing is written before: the state directory is locked in between); refuses
    (WorkspaceError) a state directory or memory database inside the workspace, a dirty tree
    without --allow-dirty, and a session branch that is the branch the person has checked
    out."""
    spec = run.session.spec.workspace
    branch = spec.branch or default_session_branch(run.name)
    dest = run.state_dir / "workspace"
    if args.workspace is None:
        base = manifest_dir(args.files[-1]) if args.files else Path.cwd()
        return lambda: prepare_workspace(spec, base, dest, branch)
    directory = args.workspace.resolve()
    top = repository_top(directory)
    tree = top or directory
    # Everything `corral run` writes stays out of the tree the agent's commits come from.
    if is_inside(run.state_dir, tree):
        named = "--state-dir" if args.state_dir is not None else "the default state directory"
        raise WorkspaceError(
            f"{named} {run.state_dir} is inside the workspace {tree}: its secrets, logs and "
            "transcripts would sit in the repository; choose a directory outside it"
        )
    if is_inside(memory_file(), tree):
        raise WorkspaceError(
            f"the memory database {memory_file()} (${MEMORY_ENV}) is inside the workspace "
            f"{tree}; choose a path outside it"
        )
    if top is None:
        return lambda: SessionCheckout(root=directory)
    # The Agent's branch patterns were checked with the manifests (check_session_branch); the
    # work starts from the checked-out branch, which the session never writes (land does).
    if branch == current_branch(top):
        raise WorkspaceError(
            f"spec.workspace.branch {branch!r} is the branch checked out in {top}, where the "
            "work starts from: the agent's commits go on a branch of their own; name another"
        )
    if not args.allow_dirty:
        dirty = dirty_paths(top)
        if dirty:
            raise WorkspaceError(dirty_message(top, dirty))
    return lambda: worktree_checkout(directory, dest, branch)


def with_output_schema(session: Session, path: Path) -> Session:
    """`session` with the JSON Schema in `path` as its spec.outputSchema, checked as the API
    server and the operator check it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"--output-schema {path}: {exc.strerror or exc}") from exc
    try:
        schema = json.loads(text)
    except json.JSONDecodeError:
        import yaml

        try:
            schema = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ManifestError(f"--output-schema {path}: neither JSON nor YAML: {exc}") from exc
    body = session.model_dump(by_alias=True, exclude_none=True, mode="json")
    body["spec"]["outputSchema"] = schema
    try:
        return Session.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ManifestError(f"--output-schema {path}: {first['msg']}") from exc
