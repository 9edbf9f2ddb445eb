"""The working tools: read, write, edit, bash, grep, glob.

They act through a `Workspace`: in-process (`LocalWorkspace`) or the tools container's exec
service (`tools._exec_client.ExecWorkspace`, imported by the server only: it is the httpx
adapter). Either way every path is resolved (symlinks, `..`) against the granted root and
refused outside it, and bash and grep run with the granted root as cwd. The words the model
reads are made here, once, for both. A read-only session refuses write, edit and bash here,
whatever the policy said, because this is the last place a call passes before it acts.
"""

from __future__ import annotations

from typing import Any

from ..paths import GrantedRoot
from ..ports import CommandOutcome, ToolSpec, Workspace, WorkspaceError
from . import _files, _shell
from ._local import LocalWorkspace, run_command
from ._result import ToolRefused, ToolResult, cap_output, refusal

__all__ = [
    "CommandOutcome",
    "LocalWorkspace",
    "ToolResult",
    "WorkingTools",
    "cap_output",
    "run_command",
]

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
    """Runs the working tools in one workspace (a bare `GrantedRoot` means in-process)."""

    def __init__(
        self,
        workspace: Workspace | GrantedRoot,
        *,
        read_only: bool = False,
        bash_timeout: float = 120.0,
        output_cap: int = 30_000,
    ) -> None:
        self.workspace: Workspace = (
            LocalWorkspace(workspace) if isinstance(workspace, GrantedRoot) else workspace
        )
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
        except WorkspaceError as exc:
            path = args.get("path") or "."
            return ToolResult(refusal(name, exc, str(path), self.workspace.root), True)
        except (OSError, UnicodeError, ValueError) as exc:
            return ToolResult(f"{name} failed: {exc}", True)

    async def _dispatch(self, name: str, args: dict[str, Any]) -> ToolResult:
        ws = self.workspace
        if name == "read":
            return await _files.read(ws, args)
        if name == "write":
            return await _files.write(ws, args)
        if name == "edit":
            return await _files.edit(ws, args)
        if name == "glob":
            return await _files.glob(ws, args)
        if name == "grep":
            return await _shell.grep(ws, args, timeout=self.bash_timeout)
        return await _shell.bash(
            ws, args, default_timeout=self.bash_timeout, output_cap=self.output_cap
        )
