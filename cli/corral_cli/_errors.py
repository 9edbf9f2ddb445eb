"""The error contract of every `corral` command (docs/cli.md, "Exit status and errors").

Whatever goes wrong, a command prints one or two lines on stderr, what went wrong and what to
do, and exits 2; 1 is kept for an outcome the command reports (a session that did not succeed,
a gate that failed), as each command's `--help` says; 130 is an interrupt. No traceback: the
known failures (the kubeconfig, the API server, the archive reader, files) are explained here,
anything else is an internal error in one line (`CORRAL_DEBUG=1` prints its traceback). With
`--json` or `-o json` the same error is also the last line of stdout, as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_OUTCOME = 1  # only for an outcome the command reports (its --help says which)
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

DEBUG_ENV = "CORRAL_DEBUG"
NO_COLOR_FLAG = "--no-color"

# What to do next, by what failed.
_KUBECONFIG_HINT = "point $KUBECONFIG or --kubeconfig at a kubeconfig with a current context"
_RBAC_HINT = "ask for the access this needs (docs/cli.md lists each command's RBAC)"
_CRDS_HINT = (
    "are Corral's CRDs installed in this cluster? (`kubectl get crd sessions.corral.dev`, "
    "docs/operations.md)"
)


class CommandError(Exception):
    """A failure the command can name: `message` (what went wrong) and `hint` (what to do)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def exit_epilog(outcome: str | None = None) -> str:
    """The `exit status:` line of a command's --help; `outcome` is what 1 means, if anything."""
    parts = ["0 done"]
    if outcome:
        parts.append(f"1 {outcome}")
    parts.append(
        "2 an error (bad usage, no kubeconfig, the API server unreachable or refusing, no "
        "such object: the message says what to do)"
    )
    parts.append("130 interrupted")
    return "exit status: " + ", ".join(parts)


class UsageError(CommandError):
    """Bad usage: a flag, an argument or a combination argparse (or the command) refuses."""


class Parser(argparse.ArgumentParser):
    """argparse with the contract: bad usage is a UsageError, reported by the guard as every
    error is (two lines, exit 2, JSON too under --json) rather than argparse's usage block;
    every command takes --no-color (main applies it before the command runs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument(
            NO_COLOR_FLAG, action="store_true", help="no colour in the output (also: $NO_COLOR)"
        )

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, f"see `{self.prog} --help`")


# The attribute of an argparse action that lists the words completion offers for it, where
# argparse's own `choices` would be too strict (short names, free text).
COMPLETIONS_ATTR = "corral_completions"


def offer(action: argparse.Action, words: Sequence[str]) -> argparse.Action:
    """Let `corral completion` offer `words` for this argument."""
    setattr(action, COMPLETIONS_ATTR, tuple(words))
    return action


def no_color() -> bool:
    """Whether colour is off: NO_COLOR set to anything but empty (no-color.org)."""
    return os.environ.get("NO_COLOR", "") != ""


def wants_json(argv: Sequence[str]) -> bool:
    """Whether the command was asked for JSON: `--json`, `-o json` or `--output json`."""
    words = list(argv)
    if "--" in words:
        words = words[: words.index("--")]
    for i, word in enumerate(words):
        if word == "--json" or word in ("-ojson", "-o=json", "--output=json"):
            return True
        if word in ("-o", "--output") and i + 1 < len(words) and words[i + 1] == "json":
            return True
    return False


def _server_of(exc: BaseException) -> str:
    """The URL an httpx failure was on its way to ('' when it does not say)."""
    cause: BaseException | None = exc
    while cause is not None:
        try:
            url = cause.request.url  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # httpx raises when no request was set
            cause = cause.__cause__
            continue
        return f"{url.scheme}://{url.netloc.decode()}"
    return ""


def _explain_kube(exc: BaseException) -> tuple[str, str | None] | None:
    try:
        import corral_kube as kube
    except ImportError:
        return None
    if isinstance(exc, kube.KubeConfigError):
        return f"no usable kubeconfig: {exc.message}", _KUBECONFIG_HINT
    if isinstance(exc, kube.KubeUnreachable):
        where = _server_of(exc)
        at = f" at {where}" if where else ""
        detail = exc.message.removeprefix("the API server is unreachable: ")
        return (
            f"cannot reach the API server{at}: {detail}",
            "check that the cluster is up and the kubeconfig's server and context are right "
            "(`kubectl cluster-info`)",
        )
    if isinstance(exc, kube.Unauthorized):
        return (
            f"the API server did not accept your credentials (401): {exc.message}",
            "renew them (log in again, or refresh the token in the kubeconfig)",
        )
    if isinstance(exc, kube.Forbidden):
        return f"the API server refused (403 Forbidden): {exc.message}", _RBAC_HINT
    if isinstance(exc, kube.NotFound):
        return f"the API server has no such resource (404): {exc.message}", _CRDS_HINT
    if isinstance(exc, kube.KubeRefused):
        reason = f" {exc.reason}" if exc.reason else ""
        return f"the API server refused ({exc.status}{reason}): {exc.message}", None
    if isinstance(exc, kube.KubeError):
        return exc.message, None
    return None


def _explain_http(exc: BaseException) -> tuple[str, str | None] | None:
    try:
        import httpx
    except ImportError:
        return None
    if not isinstance(exc, httpx.HTTPError):
        return None
    where = _server_of(exc)
    detail = str(exc) or type(exc).__name__
    return (
        f"cannot reach {where or 'the server'}: {type(exc).__name__}: {detail}",
        "check the address (and that it is served: a port-forward, a Service)",
    )


def explain(exc: BaseException) -> tuple[str, str | None] | None:
    """(what went wrong, what to do) for a failure the contract knows; None for a bug."""
    if isinstance(exc, CommandError):
        return exc.message, exc.hint
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return explain(exc.exceptions[0])
    for explainer in (_explain_kube, _explain_http):
        found = explainer(exc)
        if found is not None:
            return _one_line(found[0]), found[1]
    if isinstance(exc, OSError):
        path = f"{exc.filename}: " if exc.filename else ""
        return _one_line(f"{path}{exc.strerror or exc}"), None
    return None


def _one_line(text: str) -> str:
    """A library's message in the contract's one line (a YAML error spans several)."""
    return " ".join(text.split())


def error_record(message: str, hint: str | None, code: int) -> dict[str, Any]:
    """The JSON object an error is on stdout under --json / -o json."""
    return {
        "type": "outcome",
        "outcome": "Interrupted" if code == EXIT_INTERRUPTED else "Error",
        "answer": None,
        "commit": None,
        "error": {"message": message, **({"hint": hint} if hint else {})},
        "exitCode": code,
    }


def report(
    prog: str, message: str, hint: str | None = None, *, json_output: bool, code: int = EXIT_ERROR
) -> int:
    """The contract's lines for an error: stderr for a person, and stdout's last line as JSON
    when JSON was asked for. Returns `code`."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    if hint:
        print(f"{prog}: {hint}", file=sys.stderr)
    if json_output:
        print(json.dumps(error_record(message, hint, code), ensure_ascii=False), flush=True)
    return code


def _missing_module(exc: ImportError, prog: str) -> tuple[str, str]:
    extra = "sandbox" if prog == "corral run" else "cli"
    name = exc.name or str(exc)
    return (
        f"the Python module {name!r} is not installed, and {prog} needs it",
        f"install the {extra} extra: pip install 'corral[{extra}]'",
    )


def guard(prog: str, call: Callable[[], int], *, json_output: bool = False) -> int:
    """Run a command under the contract: its exit status, or 2 (130 on Ctrl-C) with the lines
    that say why. argparse's own exits (--help, bad usage) pass through."""
    try:
        return int(call())
    except BrokenPipeError:
        # The reader went (`corral get ... | head`): nothing more can be said on stdout, and
        # Python's own flush at exit would fail again; stdout is pointed at nothing first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C is the person's, not an error: said, not explained
        print(f"{prog}: interrupted", file=sys.stderr)
        if json_output:
            print(json.dumps(error_record("interrupted", None, EXIT_INTERRUPTED)), flush=True)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        if isinstance(exc, ImportError) and exc.name and not exc.name.startswith("corral"):
            return report(prog, *_missing_module(exc, prog), json_output=json_output)
        found = explain(exc)
        if found is None:  # a bug: one line, and the way to its traceback
            debug = os.environ.get(DEBUG_ENV)
            rerun = "" if debug else f"; rerun with {DEBUG_ENV}=1 for the traceback"
            found = (_one_line(f"internal error: {type(exc).__name__}: {exc}") + rerun, None)
        return report(prog, *found, json_output=json_output)
