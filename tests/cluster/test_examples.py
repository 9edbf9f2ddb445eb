"""Every example with `$ kubectl ...` lines in its header, run exactly as the header says, in one
namespace, concurrently, against what `make dev-cluster` gives them: the real API server, the
local node, the operator under the chart's RBAC with `--local-repo-root` at a `git daemon`
serving demo/repo (corral_dev.demo_remote, as `python -m corral_dev up` does) and the chart's
model catalog, and the scripted model playing the Sessions' parts of examples/demo/scenario.yaml.

The commands are the headers' own (tests/_examples.py parses them): the pinned kubectl, run
from the project's root with a kubeconfig whose namespace is the test's. Then each example is
held to what its header's `Expect:` promises: the Session delivered to its branch of the
remote, the Goal Met with a Pass at the wave's revision, the Evidence's Fail, the Freezes
holding and releasing a live Session, a model the catalog adds. The Agents go first (the other
headers apply agent.yaml too, unchanged by then); the admin examples go last, one at a time,
since each holds or retunes all the rest.
"""

from __future__ import annotations

import calendar
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev import demo_remote
from corral_dev.controlplane import ControlPlane
from tests._examples import EXAMPLES, ROOT, Example, all_examples, example

from ._operator_fixtures import OperatorExtras, OperatorHandle, ScriptedModelHandle, wait_for

pytestmark = pytest.mark.timeout(300)

DEADLINE = 180.0  # every example's commands, in all; kubectl waits are killed past it
AGENTS = ("examples/agent.yaml", "examples/agent-hooks.yaml", "examples/agent-memory.yaml")
ADMIN = (
    "examples/admin/freeze-namespace.yaml",
    "examples/admin/freeze-agent.yaml",
    "examples/admin/freeze-session.yaml",
    "examples/admin/model-catalog-configmap.yaml",
)
# Outside /tmp, as every repository the cluster tier serves (see test_delivery.py).
_SERVED = Path.home() / ".cache" / "corral" / "test-repos"


@dataclass
class Remote:
    repo: Path  # demo/repo as served, a working repository the Sessions push branches to
    revision: str  # its one commit, made the same everywhere
    url: str  # the operator's --local-repo-root

    def head(self, branch: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(self.repo), "rev-parse", "-q", "--verify", f"refs/heads/{branch}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return done.stdout.strip() or None

    def show(self, revision: str, path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.repo), "show", f"{revision}:{path}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    _SERVED.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="examples-", dir=_SERVED))
    repo = base / demo_remote.DEMO_REPO_PATH
    revision = demo_remote.demo_repository(repo)
    served = demo_remote.serve(base, "127.0.0.1", base.parent / f"{base.name}-git-daemon.log")
    try:
        yield Remote(repo, revision, served.root_url)
    finally:
        served.process.terminate()
        served.process.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)
        (base.parent / f"{base.name}-git-daemon.log").unlink(missing_ok=True)


@pytest.fixture
def operator_extras(remote: Remote) -> OperatorExtras:
    """The operator as the dev cluster runs it (the `operator` fixture asks for this)."""

    def args() -> list[str]:
        return [
            *("--local-repo-root", remote.url),
            *("--model-catalog-configmap", "corral-model-catalog"),
        ]

    return OperatorExtras(args=args)


# --------------------------------------------------------------------------- the commands


@dataclass
class Ran:
    command: list[str]
    code: int
    stdout: str
    stderr: str


@dataclass
class Kubectl:
    """The headers' `kubectl` lines as a person runs them after `make dev-cluster`: the pinned
    kubectl first on PATH, their kubeconfig's namespace the test's, the project's root as cwd."""

    env: dict[str, str]
    deadline: float
    log: list[str] = field(default_factory=list)

    def run(self, command: list[str]) -> Ran:
        assert command[0] == "kubectl", command
        left = self.deadline - time.monotonic()
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=self.env, capture_output=True, text=True,
                timeout=max(left, 1.0), check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Ran(command, -1, "", f"still running after the test's {DEADLINE:.0f}s")
        self.log.append(f"$ {' '.join(command)} -> {done.returncode}")
        return Ran(command, done.returncode, done.stdout, done.stderr)

    def run_all(self, commands: list[list[str]]) -> list[Ran]:
        """Each command in order; the first that fails ends it (as `set -e` would)."""
        ran: list[Ran] = []
        for command in commands:
            ran.append(self.run(command))
            if ran[-1].code != 0:
                break
        return ran


def _kubectl(cp: ControlPlane, namespace: str, where: Path) -> Kubectl:
    kubeconfig = where / "kubeconfig"
    shutil.copy(cp.kubeconfig, kubeconfig)
    cp.kubectl("config", "set-context", "--current", f"--namespace={namespace}",
               kubeconfig=kubeconfig)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CORRAL_"))}
    env |= {"KUBECONFIG": str(kubeconfig), "PATH": f"{cp.bin_dir}{os.pathsep}{env['PATH']}"}
    return Kubectl(env, time.monotonic() + DEADLINE)


def _failed(name: str, ran: list[Ran]) -> str | None:
    for r in ran:
        if r.code != 0:
            return f"{name}: `{' '.join(r.command)}` exited {r.code}:\n{r.stdout}{r.stderr}"
    return None


# ------------------------------------------------------------------------------ the checks


@dataclass
class Context:
    operator: OperatorHandle
    model: ScriptedModelHandle
    remote: Remote

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return dict((self.operator.get(kind, name) or {}).get("status") or {})

    def condition(self, kind: str, name: str, type_: str) -> dict[str, Any]:
        conditions = self.status(kind, name).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), {})


def _delivered(ctx: Context, session: str, branch: str) -> str:
    """The Session delivered its work to `branch` of the remote; the revision."""
    status = ctx.status("session", session)
    delivery = status.get("delivery") or {}
    assert delivery.get("state") == "Delivered", status
    revision = str(delivery["revision"])
    assert len(revision) == 40 and delivery["branch"] == branch, delivery
    assert ctx.remote.head(branch) == revision
    return revision


FIXED = "discount = subtotal * discount_percent / 100\n"


def _session(ctx: Context, ran: list[Ran]) -> None:
    revision = _delivered(ctx, "fix-discount", "corral/fix-discount")
    assert ctx.condition("session", "fix-discount", "Delivered")["reason"] == "Delivered"
    table = ran[-1].stdout  # `kubectl get session fix-discount -o wide`
    assert "REVISION" in table.splitlines()[0] and revision in table, table
    assert FIXED in ctx.remote.show(revision, "shop/pricing.py")
    assert ctx.status("session", "fix-discount")["turns"] == 1


def _session_plan(ctx: Context, ran: list[Ran]) -> None:
    revision = _delivered(ctx, "fix-discount-plan", "corral/fix-discount-plan")
    assert FIXED in ctx.remote.show(revision, "shop/pricing.py")
    script = yaml.safe_load((EXAMPLES / "demo" / "scenario.yaml").read_text())
    played = ctx.model.requests("fix-discount-plan")
    # Every reply of its part was asked for, the replan (`plan_edit`) included.
    assert len(played) == len(script["conversations"]["fix-discount-plan"]), len(played)


def _session_structured_output(ctx: Context, ran: list[Ran]) -> None:
    assert ran[-1].stdout == "request_changes", ran[-1]
    output = ctx.status("session", "review-discount")["output"]
    assert output["score"] == 3 and output["findings"][0]["file"] == "shop/pricing.py", output


def _session_wake(ctx: Context, ran: list[Ran]) -> None:
    status = ctx.status("session", "migration-watch")
    assert status["phase"] == "WaitingForWake" and status["turns"] == 1, status
    revision = _delivered(ctx, "migration-watch", "corral/migration-watch")
    assert "Discount-table migration" in ctx.remote.show(revision, "MIGRATION.md")
    table = ran[-1].stdout  # `kubectl get session migration-watch`: WAKES is the due time
    assert "WAKES" in table.splitlines()[0] and "WaitingForWake" in table, table
    due = calendar.timegm(time.strptime(status["wakeAt"], "%Y-%m-%dT%H:%M:%SZ"))
    assert 3000 < due - time.time() <= 3600, status["wakeAt"]  # an hour after turn 1
    assert status["wakeAt"] in table


def _goal(ctx: Context, ran: list[Ran]) -> None:
    status = ctx.status("goal", "green-discounts")
    assert status["verdict"] == "Met" and status["waves"] == 1, status
    revision = _delivered(ctx, "green-discounts-wave-1", "corral/green-discounts-wave-1")
    assert status["revision"] == revision
    checks = [
        e for e in ctx.operator.cp.list_objects("evidences", ctx.operator.namespace)
        if (e["metadata"].get("labels") or {}).get("corral.dev/goal") == "green-discounts"
    ]  # fmt: skip
    assert [(e["spec"]["revision"], e["status"]["verdict"]) for e in checks] == [
        (revision, "Pass")
    ], checks
    assert "green-discounts" in ran[-1].stdout  # `kubectl get goals`


def _evidence(ctx: Context, ran: list[Ran]) -> None:
    doc = yaml.safe_load((EXAMPLES / "evidence.yaml").read_text())
    # The revision the file names is demo/repo's one commit as the dev cluster makes it.
    assert doc["spec"]["revision"] == ctx.remote.revision
    status = ctx.status("evidence", doc["metadata"]["name"])
    assert status["verdict"] == "Fail" and status["exitCode"] == 1, status


def _approval(ctx: Context, ran: list[Ran]) -> None:
    assert ctx.status("approval", "land-fix-discount").get("decision") in (None, "Pending")
    reasons = {e.get("reason") for e in ctx.operator.events("land-fix-discount")}
    assert reasons & {"SessionNotFound", "SessionMismatch"}, reasons


def _agent(name: str) -> Callable[[Context, list[Ran]], None]:
    def check(ctx: Context, ran: list[Ran]) -> None:
        assert ctx.condition("agent", name, "Ready")["reason"] == "Validated"

    return check


CHECKS: dict[str, Callable[[Context, list[Ran]], None]] = {
    "examples/agent.yaml": _agent("fixer"),
    "examples/agent-hooks.yaml": _agent("fixer-with-hooks"),
    "examples/agent-memory.yaml": _agent("remembering-reviewer"),
    "examples/session.yaml": _session,
    "examples/session-plan.yaml": _session_plan,
    "examples/session-structured-output.yaml": _session_structured_output,
    "examples/session-wake.yaml": _session_wake,
    "examples/goal.yaml": _goal,
    "examples/evidence.yaml": _evidence,
    "examples/approval.yaml": _approval,
}


def _run_concurrently(kubectl: Kubectl, ctx: Context, examples: list[Example]) -> list[str]:
    """Each example's commands in a thread of its own; then its check. The failures, named."""

    def one(ex: Example) -> str | None:
        ran = kubectl.run_all(ex.commands_of("kubectl"))
        failed = _failed(ex.name, ran)
        if failed:
            return failed
        try:
            CHECKS[ex.name](ctx, ran)
        except AssertionError as err:
            return f"{ex.name}: {err}"
        return None

    with ThreadPoolExecutor(max_workers=len(examples)) as pool:
        return [f for f in pool.map(one, examples) if f]


# ------------------------------------------------------------------------- admin, in turn


def _frozen(ctx: Context, session: str, status: str) -> Callable[[], bool]:
    return lambda: ctx.condition("session", session, "Frozen").get("status") == status


def _freeze_holds_the_live_session(kubectl: Kubectl, ctx: Context, name: str, freeze: str) -> None:
    """Applied: the Freeze is Active and the Session still waiting (migration-watch) is held;
    deleted as the header says: it is Thawed."""
    commands = example(name).commands_of("kubectl")
    lift = [c for c in commands if c[1] == "delete"]
    assert len(lift) == 1, commands
    assert _failed(name, kubectl.run_all([c for c in commands if c[1] != "delete"])) is None
    assert ctx.condition("freeze", freeze, "Active")["reason"] == "Frozen"
    wait_for(f"{name} to hold migration-watch", _frozen(ctx, "migration-watch", "True"))
    assert _failed(name, kubectl.run_all(lift)) is None
    wait_for(f"{name} lifted to thaw migration-watch", _frozen(ctx, "migration-watch", "False"))
    assert ctx.condition("session", "migration-watch", "Frozen")["reason"] == "Thawed"


def _freeze_session(kubectl: Kubectl, ctx: Context) -> None:
    name = "examples/admin/freeze-session.yaml"
    commands = example(name).commands_of("kubectl")
    assert _failed(name, kubectl.run_all(commands[:-1])) is None
    assert ctx.condition("freeze", "session-fix-discount", "Active")["reason"] == "Frozen"
    # Its scope is one tree: the ended fix-discount stays as it was, the others are not held.
    assert ctx.status("session", "fix-discount")["phase"] == "Succeeded"
    time.sleep(1.0)  # what a wrongly wide scope would have done by now
    assert ctx.condition("session", "migration-watch", "Frozen").get("status") != "True"
    assert commands[-1][1] == "delete"
    assert _failed(name, kubectl.run_all(commands[-1:])) is None


def _model_catalog(kubectl: Kubectl, ctx: Context) -> None:
    name = "examples/admin/model-catalog-configmap.yaml"
    ran = kubectl.run_all(example(name).commands_of("kubectl"))
    assert _failed(name, ran) is None
    assert "configmap/corral-model-catalog configured" in ran[-1].stdout
    # A Session started afterwards may name the model the overlay adds.
    session = "catalog-acme"
    ctx.model.load({"conversations": {session: [{"text": "Done, as acme-coder-1."}]}})
    agent = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "acme"},
        "spec": {"identity": "You review code.", "model": "acme-coder-1",
                 "tools": {"allow": ["read"]}, "limits": {"budget": {"costUSD": 5}}},
    }  # fmt: skip
    doc = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": session},
        "spec": {"agentRef": "acme", "task": "Say done.", "workspace": {"repo": "demo/repo"}},
    }
    ctx.operator.apply(agent, doc)
    status = ctx.operator.wait_phase(session, {"Succeeded", "Failed"}, timeout=90)
    assert status["phase"] == "Succeeded", status
    (request,) = ctx.model.requests(session)
    assert request["body"]["model"] == "acme-coder-1"


# ----------------------------------------------------------------------------------- test


def test_every_kubectl_example_does_what_its_header_says(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    remote: Remote,
    tmp_path: Path,
) -> None:
    by_kubectl = {e.name: e for e in all_examples() if e.commands_of("kubectl")}
    assert sorted(by_kubectl) == sorted([*CHECKS, *ADMIN])  # each has its check here
    script = yaml.safe_load((EXAMPLES / "demo" / "scenario.yaml").read_text())
    parts = dict(script["conversations"])
    parts["green-discounts-wave-1"] = parts["green-discounts-wave-*"]  # restarts a replayed run
    scripted_model.load({"conversations": parts})
    ctx = Context(operator, scripted_model, remote)
    kubectl = _kubectl(operator.cp, operator.namespace, tmp_path)
    started = time.monotonic()

    failures = _run_concurrently(kubectl, ctx, [by_kubectl[n] for n in AGENTS])
    assert not failures, "\n\n".join(failures)
    rest = [e for n, e in by_kubectl.items() if n not in AGENTS and n not in ADMIN]
    failures = _run_concurrently(kubectl, ctx, rest)
    assert not failures, "\n\n".join([*failures, *kubectl.log, operator.logs()[-3000:]])
    concurrent = time.monotonic() - started

    _freeze_holds_the_live_session(
        kubectl, ctx, "examples/admin/freeze-namespace.yaml", "namespace"
    )
    _freeze_holds_the_live_session(kubectl, ctx, "examples/admin/freeze-agent.yaml", "agent-fixer")
    _freeze_session(kubectl, ctx)
    _model_catalog(kubectl, ctx)
    print(f"examples: {concurrent:.1f}s concurrently, {time.monotonic() - started:.1f}s in all")
