"""The working tools: read, write, edit, bash, grep, glob.

Every path is resolved (symlinks, `..`) against the granted root and refused outside it; bash
and grep run with the granted root as cwd. A read-only session refuses write, edit and bash
here, whatever the policy said, because this is the last place a call passes before it acts.
"""

from __future__ import annotations

from typing import Any

from ..paths import GrantedRoot
from ..seams import ToolSpec
from . import _files, _shell
from ._result import ToolRefused, ToolResult, cap_output
from ._shell import CommandOutcome, run_command

__all__ = ["CommandOutcome", "ToolResult", "WorkingTools", "cap_output", "run_command"]

_PATH = {"type": "string", "description": "A path, relative to the granted root or absolute."}


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "read",
        "Read a text file, with line numbers; offset and limit page through long files.",
        _schema(
            {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Lines to read."},
            },
            ["path"],
        ),
    ),
    ToolSpec(
        "write",
        "Create or overwrite a file with the given content.",
        _schema({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
        writes=True,
    ),
    ToolSpec(
        "edit",
        "Replace an exact, unique string in a file (or every occurrence with replace_all).",
        _schema(
            {
                "path": _PATH,
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
            ["path", "old_string", "new_string"],
        ),
        writes=True,
    ),
    ToolSpec(
        "bash",
        "Run a shell command in the workspace root; output is capped and long runs time out.",
        _schema(
            {
                "command": {"type": "string"},
                "timeout": {"type": "integer", "minimum": 1, "description": "Seconds (max 600)."},
            },
            ["command"],
        ),
        writes=True,
    ),
    ToolSpec(
        "grep",
        "Search file contents with a regular expression (ripgrep); prints file:line:text.",
        _schema(
            {
                "pattern": {"type": "string"},
                "path": _PATH,
                "glob": {"type": "string", "description": "Only files matching this glob."},
                "ignore_case": {"type": "boolean"},
            },
            ["pattern"],
        ),
    ),
    ToolSpec(
        "glob",
        "List files matching a glob pattern such as **/*.py, relative to the workspace root.",
        _schema({"pattern": {"type": "string"}, "path": _PATH}, ["pattern"]),
    ),
)


class WorkingTools:
    """Runs the working tools for one granted root."""

    def __init__(
        self,
        root: GrantedRoot,
        *,
        read_only: bool = False,
        bash_timeout: float = 120.0,
        output_cap: int = 30_000,
    ) -> None:
        self.root = root
        self.read_only = read_only
        self.bash_timeout = bash_timeout
        self.output_cap = output_cap
        self._by_name = {spec.name: spec for spec in SPECS}

    def specs(self) -> list[ToolSpec]:
        return list(SPECS)

    async def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        spec = self._by_name.get(name)
        if spec is None:
            return ToolResult(f"unknown tool {name!r}", True)
        if spec.writes and self.read_only:
            return ToolResult(
                f"{name} is refused: this session is read-only (no writes, no commands)", True
            )
        try:
            return await self._dispatch(name, args)
        except ToolRefused as exc:
            return ToolResult(str(exc), True)
        except (OSError, UnicodeError, ValueError) as exc:
            return ToolResult(f"{name} failed: {exc}", True)

    async def _dispatch(self, name: str, args: dict[str, Any]) -> ToolResult:
        if name == "read":
            return _files.read(self.root, args)
        if name == "write":
            return _files.write(self.root, args)
        if name == "edit":
            return _files.edit(self.root, args)
        if name == "glob":
            return _files.glob(self.root, args)
        if name == "grep":
            return await _shell.grep(self.root, args, timeout=self.bash_timeout)
        return await _shell.bash(
            self.root, args, default_timeout=self.bash_timeout, output_cap=self.output_cap
        )
