"""Irreversible actions that always wait for a human: merge, rebase, land, cluster writes.

Tool names and shell commands are both checked. The shell check reads the command text; it is
deliberately eager (an `echo git merge` asks too). It is a gate for the honest path, not the
security boundary: the custodian holds the credentials that push, land and apply need.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any, Final

from .fixed_rule import bare_name

ALWAYS_ASK_TOOLS: Final = (
    "merge*",
    "*_merge",
    "rebase*",
    "*_rebase",
    "land*",
    "*_land",
    "kube_apply*",
    "kube_patch*",
    "kube_delete*",
    "cluster_apply*",
    "cluster_patch*",
    "cluster_delete*",
)

PROTECTED_BRANCHES: Final = ("main", "master", "trunk", "develop", "release*", "prod*")

_GIT = r"(?:^|[\s;&|(`])git(?:\s+-[cC]\s+\S+|\s+--?[\w-]+(?:=\S+)?)*\s+"
_ASK_PATTERNS: Final = (
    (re.compile(_GIT + r"merge\b"), "git merge"),
    (re.compile(_GIT + r"rebase\b"), "git rebase"),
    (re.compile(_GIT + r"pull\b"), "git pull (merges or rebases)"),
    (re.compile(_GIT + r"am\b"), "git am"),
    (
        re.compile(r"(?:^|[\s;&|(`])kubectl\b[^;&|\n]*?\s(apply|patch|delete|replace|edit)\b"),
        "kubectl apply/patch/delete",
    ),
    (re.compile(r"(?:^|[\s;&|(`])helm\s+(install|upgrade|uninstall|delete)\b"), "helm release"),
)
_PUSH = re.compile(_GIT + r"push\b(?P<rest>[^;&|\n]*)")
_PUSH_FORCE = re.compile(r"(?:^|\s)(-f|--force\S*|--mirror|--all|--delete|-d|--tags)(?:\s|$)")


def _protected(ref: str) -> bool:
    dst = ref.split(":", 1)[1] if ":" in ref else ref
    dst = dst.lstrip("+").removeprefix("refs/heads/")
    return any(fnmatchcase(dst, p) for p in PROTECTED_BRANCHES) or ref.startswith("+")


def shell_ask_reason(command: str) -> str | None:
    for pattern, what in _ASK_PATTERNS:
        if pattern.search(command):
            return f"{what} always needs a human decision"
    for match in _PUSH.finditer(command):
        rest = match.group("rest")
        if _PUSH_FORCE.search(rest):
            return "a forced, mirrored, deleting or all-branches git push needs a human decision"
        words = [w for w in rest.split() if not w.startswith("-")]
        # git push [remote] [refspec...]: the refspecs follow the remote.
        if any(_protected(ref) for ref in words[1:]):
            return "git push to a protected branch always needs a human decision"
    return None


def ask_reason(name: str, tool_input: dict[str, Any]) -> str | None:
    bare = bare_name(name).lower()
    if any(fnmatchcase(bare, p) for p in ALWAYS_ASK_TOOLS):
        return f"{bare} always needs a human decision"
    if name == "bash":
        command = tool_input.get("command")
        if isinstance(command, str):
            return shell_ask_reason(command)
    return None
