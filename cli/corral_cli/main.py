"""`corral`: the user's command line. Subcommands load their own modules on demand, so `corral
run` does not pay for what `corral context` imports, and the other way round."""

from __future__ import annotations

import sys

USAGE = """usage: corral <command> [options]

commands:
  run       run one Session on this machine: corral run -f session.yaml [--workspace DIR]
  context   print the context the harness would assemble: corral context -f session.yaml ...
  freeze    hold a session tree, an agent's sessions or a namespace: corral freeze session NAME
  unfreeze  lift it: corral unfreeze session NAME (also: agent NAME, namespace)
  get       list them: corral get sessions|goals|approvals|evidence [NAME] [-A] [-o json|yaml|wide]
  describe  one Session's story: corral describe session NAME (turns, receipts, plan, children)
  logs      its turn stream, live or archived: corral logs NAME [-f]
  tree      a Session and the Sessions it started: corral tree NAME
  approve   approve an Approval with your own credentials: corral approve NAME
  deny      deny it: corral deny NAME --reason TEXT
  reply     answer the question a Session waits on: corral reply NAME TEXT
  evidence  the CI gate: corral evidence check --repo URL --revision SHA [--check NAME]
  console   the web console, with your own credentials: corral console [--port N] [-A]

`corral <command> --help` describes a command's options.
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "run":
        from .run_cmd import run_command

        return run_command(rest)
    if command == "context":
        from corral_cli.context_cmd import main as context_main  # type: ignore[import-untyped,unused-ignore]

        result = context_main(rest)
        return int(result or 0)
    if command in ("freeze", "unfreeze"):
        from .freeze_cmd import main as freeze_main

        return freeze_main(command, rest)
    if command == "get":
        from .get_cmd import main as get_main

        return get_main(rest)
    if command in ("describe", "logs", "tree"):
        from importlib import import_module

        module = import_module(f"corral_cli.{command}_cmd")
        return int(module.main(rest))
    if command in ("approve", "deny"):
        from .approval_cmd import decide_main

        return decide_main(command, rest)
    if command == "reply":
        from .reply_cmd import main as reply_main

        return reply_main(rest)
    if command == "evidence":
        from .evidence_cmd import main as evidence_main

        return evidence_main(rest)
    if command == "console":
        from .console_cmd import main as console_main

        return console_main(rest)
    print(f"corral: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
