"""`python -m corral_dev.scripted --port N --script FILE`"""

from __future__ import annotations

import argparse

import uvicorn

from . import ScriptedModel, load_script


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="An Anthropic-compatible scripted model server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--script", help="YAML or JSON script file (see the module docstring)")
    args = parser.parse_args(argv)
    model = ScriptedModel(load_script(args.script) if args.script else None)
    uvicorn.run(model.app, host=args.host, port=args.port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
