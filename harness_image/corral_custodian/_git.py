"""`git push` on the agent's behalf, without trusting the agent's repository.

The workspace is writable by the agent, so its `.git/config` and hooks are the agent's: a
`core.hooksPath`, `core.fsmonitor`, `url.*.insteadOf` or credential helper there would run or
redirect inside the container that holds the credentials. So the custodian never pushes from
the workspace. It fetches the workspace's objects into a bare repository of its own (fetching
reads objects; it runs none of the workspace's hooks) and pushes from there, to the remote URL
pinned at start, with its own credential store and without force.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GitResult:
    ok: bool
    output: str
    revision: str = ""


class GitPusher:
    def __init__(
        self,
        workspace: Path,
        mirror: Path,
        remote_url: str,
        credentials_file: Path | None,
    ) -> None:
        self.workspace = workspace
        self.mirror = mirror
        self.remote_url = remote_url
        self.credentials_file = credentials_file

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.mirror),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C",
        }

    def _config(self) -> list[str]:
        args = ["-c", "core.hooksPath=" + os.devnull, "-c", f"safe.directory={self.workspace}"]
        args += ["-c", "credential.helper="]
        if self.credentials_file is not None:
            args += ["-c", f"credential.helper=store --file={self.credentials_file}"]
        return args

    async def _git(self, *args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            "git",
            *self._config(),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=self._env(),
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
        return process.returncode or 0, out.decode("utf-8", "replace").strip()

    async def _fetch_workspace(self) -> GitResult:
        if not (self.mirror / "HEAD").exists():
            self.mirror.mkdir(parents=True, exist_ok=True)
            code, out = await self._git("init", "--bare", "-q", str(self.mirror))
            if code:
                return GitResult(False, f"cannot prepare the push mirror: {out}")
        code, out = await self._git(
            "-C", str(self.mirror), "fetch", "-q", "--no-tags", "--no-recurse-submodules",
            str(self.workspace), "+HEAD:refs/corral/head", "+refs/heads/*:refs/corral/heads/*",
        )  # fmt: skip
        if code:
            return GitResult(False, f"cannot read the workspace's commits: {out}")
        code, head = await self._git("-C", str(self.mirror), "rev-parse", "refs/corral/head")
        return GitResult(code == 0, head, revision=head if code == 0 else "")

    async def push_head(self, branch: str) -> GitResult:
        """Push the workspace's HEAD to `branch` on the pinned remote, fast-forward only."""
        fetched = await self._fetch_workspace()
        if not fetched.ok:
            return fetched
        return await self._push(fetched.revision, branch)

    async def push_revision(self, revision: str, branch: str) -> GitResult:
        """Push one commit of the workspace (by full SHA) to `branch`, fast-forward only."""
        fetched = await self._fetch_workspace()
        if not fetched.ok:
            return fetched
        code, _ = await self._git(
            "-C", str(self.mirror), "cat-file", "-e", f"{revision}^{{commit}}"
        )
        if code:
            return GitResult(False, f"revision {revision} is not a commit in the workspace")
        return await self._push(revision, branch)

    async def _push(self, revision: str, branch: str) -> GitResult:
        code, out = await self._git(
            "-C", str(self.mirror), "push", "--porcelain", "--no-verify", self.remote_url,
            f"{revision}:refs/heads/{branch}",
        )  # fmt: skip
        return GitResult(code == 0, out, revision=revision)


async def origin_url(workspace: Path) -> str | None:
    """The workspace's origin URL, read once at start, before the agent has run anything."""
    process = await asyncio.create_subprocess_exec(
        "git", "-c", f"safe.directory={workspace}", "-C", str(workspace),
        "config", "--get", "remote.origin.url",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1",
             "GIT_CONFIG_GLOBAL": os.devnull},
    )  # fmt: skip
    out, _ = await process.communicate()
    url = out.decode().strip()
    return url or None
