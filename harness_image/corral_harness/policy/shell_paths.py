"""Paths a shell command names where it writes or moves to, checked against the granted root.

This reads the command text with shlex: redirection targets (`>`, `>>`, `&>`, `2>`), the
arguments of `tee`, and the directory of `cd`/`pushd`. It cannot see every path a program may
open (a script, `$(...)`, an interpreter); the sandbox pod is the boundary for those. What it
does see is refused early with a reason the model can act on, instead of failing later.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Final

from ..paths import PathVerdict
from ..ports import PathClassifier, ToolDecision

# Device files a command may always write to.
HARMLESS_TARGETS: Final = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_REDIRECT = re.compile(r"^(?:\d*|&)>>?(?P<target>.*)$")
_SEPARATORS: Final = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n"})


def _words(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return None  # unbalanced quotes: the shell will fail too


def _targets(words: list[str]) -> Iterator[str]:
    at_start = True
    i = 0
    while i < len(words):
        word = words[i]
        if word in _SEPARATORS:
            at_start = True
            i += 1
            continue
        redirect = _REDIRECT.match(word)
        if redirect:
            target = redirect.group("target")
            if target.startswith("&"):
                target = ""  # 2>&1: a descriptor, not a file
            elif not target and i + 1 < len(words) and words[i + 1] not in _SEPARATORS:
                i += 1
                target = words[i]
                if target.startswith("&") or target.isdigit():
                    target = ""
            if target:
                yield target
        elif at_start and word in ("cd", "pushd") and i + 1 < len(words):
            if words[i + 1] not in _SEPARATORS and not words[i + 1].startswith("-"):
                yield words[i + 1]
        elif at_start and word == "tee":
            j = i + 1
            while j < len(words) and words[j] not in _SEPARATORS:
                if not words[j].startswith("-"):
                    yield words[j]
                j += 1
        at_start = False
        i += 1


async def check_shell_paths(root: PathClassifier, command: str) -> ToolDecision | None:
    words = _words(command)
    if words is None:
        return None
    for target in _targets(words):
        if target in HARMLESS_TARGETS:
            continue
        if "$" in target or "`" in target or target.startswith("~"):
            return ToolDecision("ask", f"the shell path {target!r} depends on expansion")
        verdict = await root.classify(target)
        if verdict is PathVerdict.OUTSIDE:
            return ToolDecision(
                "deny", f"the command writes or moves to {target!r}, outside the granted root"
            )
        if verdict is PathVerdict.UNCERTAIN:
            return ToolDecision("ask", f"the shell path {target!r} may leave the granted root")
    return None
