"""`corral`: the user's command line. Subcommands load their own modules on demand, so `corral
run` does not pay for what `corral context` imports, and the other way round. Every command
runs under one guard (`_errors.guard`): whatever fails, a line or two and exit 2, never a
traceback (docs/cli.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib import import_module

from ._errors import NO_COLOR_FLAG, guard, wants_json

USAGE = """usage: corral <command> [options]

commands:
  run         run one Session on this machine: corral run -f session.yaml [--workspace DIR]
  context     print the context the harness would assemble: corral context -f session.yaml ...
  freeze      hold a session tree, an agent's sessions or a namespace: corral freeze session NAME
  unfreeze    lift a freeze: corral unfreeze session NAME (also: agent NAME, namespace)
  get         list Corral's objects: corral get sessions|agents|goals|approvals|evidence|freezes
  describe    one object's fields, conditions and Events: corral describe session NAME
  logs        a Session's turn stream, live or archived: corral logs NAME [-f]
  tree        a Session and the Sessions it started: corral tree NAME
  approve     approve an Approval with your own credentials: corral approve NAME
  deny        deny an Approval: corral deny NAME --reason TEXT
  reply       answer the question a Session waits on: corral reply NAME TEXT
  suspend     park a Session, its pod released: corral suspend NAME [--now]
  resume      bring a suspended Session back in a new pod: corral resume NAME
  evidence    the CI gate: corral evidence check --repo URL --revision SHA [--check NAME]
  console     the web console, with your own credentials: corral console [--port N] [-A]
  version     this client's version, and the cluster's CRDs and operator: corral version
  completion  a shell completion script: corral completion bash|zsh|fish

options for every command: --no-color (also: $NO_COLOR), -h/--help; corral --version

`corral <command> --help` describes a command's options and what its exit status means.
"""

# The command -> (its module, the name of its parser factory there). The factories of
# freeze/unfreeze, suspend/resume and approve/deny take the command's name.
_PARSERS: dict[str, tuple[str, str]] = {
    "run": ("run_cmd", "build_parser"),
    "context": ("context_cmd", "build_parser"),
    "freeze": ("freeze_cmd", "build_parser"),
    "unfreeze": ("freeze_cmd", "build_parser"),
    "get": ("get_cmd", "build_parser"),
    "describe": ("describe_cmd", "build_parser"),
    "logs": ("logs_cmd", "build_parser"),
    "tree": ("tree_cmd", "build_parser"),
    "approve": ("approval_cmd", "build_parser"),
    "deny": ("approval_cmd", "build_parser"),
    "reply": ("reply_cmd", "build_parser"),
    "suspend": ("suspend_cmd", "build_parser"),
    "resume": ("suspend_cmd", "build_parser"),
    "evidence": ("evidence_cmd", "build_parser"),
    "console": ("console_cmd", "build_parser"),
    "version": ("version_cmd", "build_parser"),
    "completion": ("completion_cmd", "build_parser"),
}
COMMANDS = tuple(_PARSERS)


def summaries() -> dict[str, str]:
    """Each command's line in USAGE, without its example: what completion describes it by."""
    listed = USAGE.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    found = {}
    for line in listed.splitlines():
        name, _, text = line.strip().partition(" ")
        found[name] = text.strip().split(": ", 1)[0]
    return found


_VERBED = frozenset({"freeze", "unfreeze", "approve", "deny", "suspend", "resume"})


def command_parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser of `corral COMMAND` (the completion scripts are built from them)."""
    module_name, factory_name = _PARSERS[command]
    factory = getattr(import_module(f"corral_cli.{module_name}"), factory_name)
    parser: argparse.ArgumentParser = factory(command) if command in _VERBED else factory()
    return parser


def _dispatch(command: str, rest: list[str], program: bool) -> int:
    if command == "run":
        from .run_cmd import run_command

        return run_command(rest, program=program)
    if command in ("freeze", "unfreeze"):
        from .freeze_cmd import main as freeze_main

        return freeze_main(command, rest)
    if command in ("suspend", "resume"):
        from .suspend_cmd import main as suspend_main

        return suspend_main(command, rest)
    if command in ("approve", "deny"):
        from .approval_cmd import decide_main

        return decide_main(command, rest)
    if command == "completion":
        from .completion_cmd import main as completion_main

        return completion_main(rest, summaries(), command_parser)
    module_main: Callable[[list[str]], int | None] = import_module(
        f"corral_cli.{_PARSERS[command][0]}"
    ).main
    return int(module_main(rest) or 0)


def _options(args: list[str]) -> list[str]:
    """The words before `--` (after it, an argument is never an option)."""
    return args[: args.index("--")] if "--" in args else args


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if NO_COLOR_FLAG in _options(args):
        # Applied before any command runs, so every Console and every child process sees it.
        os.environ["NO_COLOR"] = "1"
        if args and args[0] == NO_COLOR_FLAG:
            args = args[1:]
    if args and args[0] == "--version":
        args = ["version", *args[1:]]
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in _PARSERS:
        print(f"corral: error: unknown command {command!r}\nsee `corral --help`", file=sys.stderr)
        return 2
    program = argv is None  # the process's own entry point, not a caller in the same process
    return guard(
        f"corral {command}",
        lambda: _dispatch(command, rest, program),
        json_output=wants_json(rest),
    )


if __name__ == "__main__":
    sys.exit(main())
