"""`python -m corral_dev.providers {bedrock,vertex,gateway} --upstream URL ...`"""

from __future__ import annotations

import importlib
import sys

KINDS = ("bedrock", "vertex", "gateway")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in KINDS:
        print(f"usage: python -m corral_dev.providers {{{','.join(KINDS)}}} ...", file=sys.stderr)
        return 2
    module = importlib.import_module(f"corral_dev.providers._{args[0]}")
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
