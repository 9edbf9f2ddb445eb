"""`corral run`'s inline flags (docs/cli.md, "corral run"): `--task`, `--model`, `--max-turns`,
`--max-budget-usd` change the Session (and its Agent) the YAML gives, or build one from `--task`
alone, and `--dry-run` prints what would run. Each flag writes the field the operator and the
harness already read, and the result goes through `validate_resource` again, so a flag's value
is judged exactly as the same value written in the YAML would be:

- `--task TEXT`         -> Session spec.task
- `--model NAME`        -> Session spec.overrides.model
- `--max-budget-usd X`  -> Session spec.budget.costUSD (the custodian's cap; it only lowers the
                           Agent's spec.limits.budget, never raises it)
- `--max-turns N`       -> Agent spec.limits.maxTurns (a Session has no turn limit of its own)
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from corral_api import Agent, Session

from ._manifests import ManifestError, Manifests, validate_resource


def add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        metavar="TEXT",
        help="the task (spec.task): replaces the Session's, or with no -f builds a Session "
        "for the one Agent given (--agent) on --workspace (default: this directory)",
    )
    p.add_argument(
        "--model", metavar="NAME", help="the model for this session (spec.overrides.model)"
    )
    p.add_argument(
        "--max-turns",
        metavar="N",
        type=int,
        help="turns the session may take (the Agent's spec.limits.maxTurns)",
    )
    p.add_argument(
        "--max-budget-usd",
        metavar="X",
        type=float,
        help="the session's cost cap in USD (spec.budget.costUSD; it can only lower the Agent's)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print the Agent and Session that would run, then exit 0 (nothing "
        "is started or written)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        help="with --dry-run: how to print them (default yaml)",
    )


def wants_flags(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, name) is not None for name in ("task", "model", "max_turns", "max_budget_usd")
    )


def inline_session(args: argparse.Namespace, found: Manifests) -> Session:
    """The Session `--task` stands for when no -f gives one: the one Agent given, the task,
    and --workspace (else this directory) as its repository."""
    if len(found.agents) != 1:
        known = ", ".join(sorted(found.agents)) or "none"
        raise ManifestError(
            f"--task without -f runs on the one Agent given with --agent (Agents given: {known})"
        )
    task = str(args.task)
    name = "task-" + hashlib.sha256(task.encode()).hexdigest()[:8]
    repo = (args.workspace or Path.cwd()).resolve()
    doc = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name},
        "spec": {"agentRef": next(iter(found.agents)), "task": task,
                 "workspace": {"repo": str(repo)}},
    }  # fmt: skip
    resource = validate_resource(doc, "--task")
    assert isinstance(resource, Session)
    return resource


def _given(resource: Agent | Session) -> dict[str, Any]:
    """The fields the YAML (or a flag) set, without the defaults the model filled in."""
    return resource.model_dump(by_alias=True, exclude_unset=True, mode="json")


def _named(flag: str, doc: dict[str, Any]) -> Any:
    """`doc` validated again, the flag named as where a refused value came from."""
    try:
        return validate_resource(doc, flag)
    except ManifestError as exc:
        raise ManifestError(f"{flag}: {exc}") from None


def with_flags(args: argparse.Namespace, session: Session, agent: Agent) -> tuple[Session, Agent]:
    """`session` and `agent` with the flags' values written into their fields."""
    if args.max_turns is not None:
        body = _given(agent)
        body["spec"].setdefault("limits", {})["maxTurns"] = args.max_turns
        agent = _named("--max-turns", body)
    body = _given(session)
    spec = body["spec"]
    flags = []
    if args.task is not None:
        spec["task"] = args.task
        flags.append("--task")
    if args.model is not None:
        spec.setdefault("overrides", {})["model"] = args.model
        flags.append("--model")
    if args.max_budget_usd is not None:
        spec.setdefault("budget", {})["costUSD"] = args.max_budget_usd
        flags.append("--max-budget-usd")
    if flags:
        session = _named(", ".join(flags), body)
    return session, agent


def dry_run_text(session: Session, agent: Agent, output: str | None) -> str:
    """The Agent and the Session as `kubectl apply -f -` would take them: YAML documents, or
    a JSON List."""
    docs = [_given(agent), _given(session)]
    for doc in docs:
        doc.pop("status", None)
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2)
    return str(yaml.safe_dump_all(docs, sort_keys=False)).rstrip("\n")
