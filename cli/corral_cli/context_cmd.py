"""`corral context`: print exactly what the harness would put in the model's window.

    corral context -f session.yaml --workspace DIR [--agent agent.yaml]
                   [--budget LAYER=TOKENS ...] [--json]

It reads the Session (and its Agent, from -f, --agent or a YAML file next to the Session),
then runs the same assembly the turn runs for the first generation of the task: the five layers
with their budgets and strategies, the tools the Agent would see, and the messages. Exit status:
0 printed, 1 printed but the window does not fit (the turn would stop), 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from corral_api.kinds import AgentSpec, SessionSpec
from corral_harness.context import UnknownLayer, resolve_budgets
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import ModelRequestPlan, ToolSpec, TurnContext

from ._errors import Parser, exit_epilog
from ._errors import report as report_error
from ._manifests import ManifestError, load_manifests, pick_session

WORKING_TOOLS = (
    ("read", False),
    ("write", True),
    ("edit", True),
    ("bash", True),
    ("grep", False),
    ("glob", False),
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral context",
        description="Print the context the harness would assemble for a Session's task.",
        epilog=exit_epilog("printed, but the window does not fit: the turn would stop"),
    )
    p.add_argument("-f", "--filename", required=True, type=Path, help="Session YAML file")
    p.add_argument(
        "--workspace", required=True, type=Path, help="the checked-out workspace (granted root)"
    )
    p.add_argument("--agent", type=Path, help="Agent YAML, when it is not in the -f file")
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="LAYER=TOKENS",
        help="override one layer's token budget (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def parse_budgets(items: list[str]) -> dict[str, int]:
    budgets: dict[str, int] = {}
    for item in items:
        layer, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"--budget {item!r}: expected LAYER=TOKENS with a whole number")
        budgets[layer.strip()] = int(value)
    resolve_budgets(None, budgets)  # unknown layer names fail here, with the known ones listed
    return budgets


def _window_lookup(model: str) -> int | None:
    try:
        from corral_common.catalog import window_of
    except ImportError:  # the catalog is optional here; assembly falls back to its default
        return None
    return window_of(model)


def build_report(
    agent: AgentSpec, session: SessionSpec, workspace: Path, budgets: dict[str, int]
) -> dict[str, Any]:
    model = (session.overrides.model if session.overrides else None) or agent.model
    thinking = (session.overrides.thinking_level if session.overrides else None) or (
        agent.thinking_level
    )
    policy = CorralTurnPolicy(
        granted_root=workspace,
        agent=agent,
        read_only=session.read_only,
        window_lookup=_window_lookup,
        budgets=budgets,
    )
    ctx = TurnContext(
        conversation="corral-context",
        submission_id="preview",
        agent=agent,
        model=model,
        thinking_level=thinking,
        granted_root=policy.root.root,
        read_only=session.read_only,
        context_window=0,
        max_output_tokens=agent.limits.max_output_tokens,
    )
    transcript: list[dict[str, Any]] = [{"role": "user", "content": session.task}]
    catalog = [
        ToolSpec(name, f"The {name} working tool.", {"type": "object"}, writes=writes)
        for name, writes in WORKING_TOOLS
    ]
    tools = policy.visible_tools(ctx, catalog)
    assembled = policy.assemble_context(transcript, ctx)
    plan: ModelRequestPlan = asyncio.run(policy.prepare_request(ctx, transcript))
    return {
        "model": model,
        "layers": [layer.to_json() for layer in assembled.layers],
        "prompt": plan.system,
        "tokens": assembled.tokens,
        "estimated": assembled.estimated,
        "tools": [t.name for t in tools],
        "messages": plan.messages,
        "stopReason": plan.stop_reason,
    }


def render_text(report: dict[str, Any]) -> str:
    lines = [f"model: {report['model']}", ""]
    for layer in report["layers"]:
        est = " (estimated)" if layer["estimated"] else ""
        lines.append(
            f"{layer['name']:<18} {layer['tokens']:>7} tokens{est}  budget {layer['budget']:<7}"
            f" {layer['strategy']}" + ("  truncated" if layer["truncated"] else "")
        )
        if layer["kept"]:
            lines.append(f"    kept:    {', '.join(s or '(text)' for s in layer['kept'])}")
        if layer["dropped"]:
            lines.append(f"    dropped: {', '.join(s or '(text)' for s in layer['dropped'])}")
    lines += ["", f"tools: {', '.join(report['tools'])}"]
    if report["stopReason"]:
        lines += ["", f"the provider would not be called: {report['stopReason']}"]
    lines += ["", "----- system prompt -----", report["prompt"], "", "----- messages -----"]
    for message in report["messages"]:
        for block in message["content"]:
            text = block.get("text", json.dumps(block, ensure_ascii=False))
            lines.append(f"[{message['role']}] {text}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        budgets = parse_budgets(args.budget)
        workspace: Path = args.workspace
        if not workspace.is_dir():
            raise ValueError(f"--workspace {str(workspace)!r} is not a directory")
        paths = [args.filename] + ([args.agent] if args.agent else [])
        session, agent = pick_session(load_manifests(paths), [args.filename.parent])
        report = build_report(agent.spec, session.spec, workspace, budgets)
    except (ManifestError, UnknownLayer, ValueError) as exc:
        return report_error("corral context", str(exc), json_output=args.json)
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    return 1 if report["stopReason"] else 0
