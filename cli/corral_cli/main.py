"""`corral`: the user's command line. Subcommands load their own modules on demand, so `corral
run` does not pay for what `corral context` imports, and the other way round."""

from __future__ import annotations

import sys

USAGE = """usage: corral <command> [options]

commands:
  run       run one Session on this machine: corral run -f session.yaml [--workspace DIR]
  context   print the context the harness would assemble: corral context -f session.yaml ...

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
    print(f"corral: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
