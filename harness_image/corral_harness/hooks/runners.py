"""Where an `Agent.spec.hooks` handler runs (ADR 0075): the adapters behind `HookRunner`.

- A command, by default, runs here in the harness container: `/bin/sh -c` in a scratch
  directory of its own, with a clean environment, its own process group (killed on timeout),
  the event as JSON on stdin. It sees the call, not the workspace (a pod's harness does not
  mount it), and the agent's commands cannot reach it.
- A command with `runIn: tools` runs through the `Workspace` (the exec service in the tools
  container, beside the agent's commands, in the granted root): advisory, since the agent can
  change what it runs on. The exec API has no stdin and merges the streams, so a small shell
  wrapper pipes the event in and prints stderr after a marker line.
- An `http` hook is POSTed to the custodian (`/agents/{conversation}/hooks/{phase}/{name}`),
  which reads the URL and any credential from the Agent itself and relays the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import httpx

from corral_api.hook_spec import HookSpec

from ..ports import Workspace, WorkspaceError
from ._spec import HookReply

MAX_ANSWER_BYTES = 1024 * 1024
ERR_MARKER = "--corral-hook-stderr-6f1c--"
# $1: the event JSON, $2: the command. stdout is the answer; stderr follows the marker.
TOOLS_WRAPPER = (
    'err=$(mktemp) || exit 125; printf %s "$1" | /bin/sh -c "$2" 2>"$err"; rc=$?; '
    f'printf "\\n%s\\n" "{ERR_MARKER}"; cat "$err"; rm -f "$err"; exit $rc'
)
CLEAN_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ")


def _reply(exit_code: int, stdout: str, stderr: str) -> HookReply:
    if exit_code == 0:
        return HookReply("answer", body=stdout)
    if exit_code == 2:
        return HookReply("denied", reason=stderr)
    detail = stderr.strip()[-500:] or stdout.strip()[-500:]
    return HookReply("failed", reason=f"exit code {exit_code}" + (f": {detail}" if detail else ""))


class LocalCommandRunner:
    """Commands in the harness's own container, each in a fresh scratch directory."""

    def __init__(self, scratch_root: Path | None = None) -> None:
        self.scratch_root = scratch_root

    def _env(self, scratch: str, hook: HookSpec, phase: str) -> dict[str, str]:
        # Nothing of the harness's environment but the basics: no CORRAL_* path leads anywhere.
        env = {k: os.environ[k] for k in CLEAN_ENV_KEYS if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(HOME=scratch, TMPDIR=scratch, CORRAL_HOOK=hook.name, CORRAL_HOOK_PHASE=phase)
        return env

    async def run(
        self, hook: HookSpec, phase: str, payload: dict[str, Any], timeout: float
    ) -> HookReply:
        assert hook.command is not None
        if self.scratch_root is not None:
            self.scratch_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="hook-", dir=self.scratch_root) as scratch:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                hook.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=scratch,
                env=self._env(scratch, hook, phase),
                start_new_session=True,
            )
            out = err = b""
            timed_out = False
            try:
                out, err = await asyncio.wait_for(
                    proc.communicate(json.dumps(payload).encode()), timeout
                )
            except TimeoutError:
                timed_out = True
            finally:
                # Whatever the command left running in its group goes with it (also on cancel).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if timed_out:
                await proc.wait()
                return HookReply("failed", reason=f"timed out after {timeout:g} s")
        assert proc.returncode is not None
        return _reply(
            proc.returncode,
            out[:MAX_ANSWER_BYTES].decode(errors="replace"),
            err[:MAX_ANSWER_BYTES].decode(errors="replace"),
        )


class ToolsCommandRunner:
    """Commands in the tools container, through the exec service, in the granted root."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def run(
        self, hook: HookSpec, phase: str, payload: dict[str, Any], timeout: float
    ) -> HookReply:
        assert hook.command is not None
        argv = ["/bin/sh", "-c", TOOLS_WRAPPER, "corral-hook", json.dumps(payload), hook.command]
        try:
            outcome = await self.workspace.run(argv, timeout=timeout, keep_bytes=MAX_ANSWER_BYTES)
        except WorkspaceError as exc:
            return HookReply("failed", reason=f"the tools container could not run it: {exc}")
        if outcome.timed_out:
            return HookReply("failed", reason=f"timed out after {timeout:g} s")
        stdout, _, stderr = outcome.output.rpartition(f"\n{ERR_MARKER}\n")
        return _reply(outcome.exit_code, stdout, stderr)


class CustodianHookRunner:
    """http hooks: POSTed through the custodian, which holds the URL's credential."""

    def __init__(self, custodian_url: str | None, credential: str | None) -> None:
        self.url = custodian_url.rstrip("/") if custodian_url else None
        self.headers = {"authorization": f"Bearer {credential}"} if credential else {}

    async def run(
        self, hook: HookSpec, phase: str, payload: dict[str, Any], timeout: float
    ) -> HookReply:
        if self.url is None:
            return HookReply(
                "failed", reason="http hooks are posted by the custodian, and none is configured"
            )
        path = f"{self.url}/agents/{payload['conversation']}/hooks/{phase}/{hook.name}"
        try:
            async with httpx.AsyncClient(timeout=timeout + 5) as client:
                response = await client.post(path, json=payload, headers=self.headers)
        except httpx.HTTPError as exc:
            return HookReply("failed", reason=f"the custodian could not be reached: {exc!r}")
        if response.status_code == 200:
            return HookReply("answer", body=response.text)
        try:
            reason = str(response.json().get("reason") or response.text)
        except ValueError:
            reason = response.text
        return HookReply("failed", reason=f"custodian {response.status_code}: {reason[:500]}")


class HookRunners:
    """The one `HookRunner` the policy gets: picks the place each hook runs."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        custodian_url: str | None = None,
        credential: str | None = None,
        scratch_root: Path | None = None,
    ) -> None:
        self.local = LocalCommandRunner(scratch_root)
        self.tools = ToolsCommandRunner(workspace)
        self.http = CustodianHookRunner(custodian_url, credential)

    async def run(
        self, hook: HookSpec, phase: str, payload: dict[str, Any], timeout: float
    ) -> HookReply:
        if hook.http is not None:
            return await self.http.run(hook, phase, payload, timeout)
        if hook.run_in == "tools":
            return await self.tools.run(hook, phase, payload, timeout)
        return await self.local.run(hook, phase, payload, timeout)
