"""`git push` on the agent's behalf, without trusting the agent's repository.

The workspace is writable by the agent, so its `.git/config`, hooks and attributes are the
agent's: a `core.hooksPath`, `core.fsmonitor`, filter driver, `url.*.insteadOf`, credential
helper or `remote.origin.url` there would run code, or redirect the credentials, inside the
container that holds them. So:

- the remote is only ever `CORRAL_GIT_REMOTE_URL` (the operator sets it from the Session's
  `spec.workspace.repo`), checked on every push to be a network remote (`rules.remote_refusal`),
  never read from the workspace, also after a restart;
- the custodian keeps a bare mirror of its own (under its state directory, created without
  templates) and every git command runs against it (`--git-dir`, cwd in the mirror), never
  with the workspace as the repository whose config is read;
- the one exception is the local fetch of the agent's commits into the mirror, which makes git
  run `upload-pack` in the workspace: it reads objects only, and the command line turns off what
  could run (`core.hooksPath=/dev/null`, `core.fsmonitor=false`; upload-pack never checks out,
  so no filter or smudge driver runs) and trusts the workspace's owner (another uid) only for
  this command (`safe.directory`);
- every other command has `protocol.file.allow=never` (and ext never), so nothing can make git
  reach a local repository; system and global config are off (`GIT_CONFIG_NOSYSTEM=1`,
  `GIT_CONFIG_GLOBAL=/dev/null`), credentials come only from the custodian's own store, and
  there is no force, no tags, no delete.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from .rules import remote_refusal

GIT_TIMEOUT = 120.0


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
        remote_url: str | None,
        credentials_file: Path | None,
    ) -> None:
        self.workspace = workspace.resolve()
        self.mirror = mirror
        self.remote_url = remote_url
        self.credentials_file = credentials_file

    def remote_refusal(self) -> str | None:
        return remote_refusal(self.remote_url)

    def _trust_file(self) -> Path:
        """A global config of the custodian's own that trusts the workspace for the local
        fetch. git drops `-c` settings (GIT_CONFIG_PARAMETERS) for the upload-pack it runs on a
        local repository, and safe.directory counts only from protected config; the file sits
        beside the mirror, where the agent cannot write."""
        path = self.mirror.parent / "workspace-trust.gitconfig"
        text = f"[safe]\n\tdirectory = {self.workspace}\n\tdirectory = {self.workspace / '.git'}\n"
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return path

    def _env(self, *, local_fetch: bool = False) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.mirror),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": str(self._trust_file()) if local_fetch else os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "LC_ALL": "C",
        }

    def _config(self, *, local_fetch: bool) -> list[str]:
        args = [
            "-c", "core.hooksPath=" + os.devnull,
            "-c", "core.fsmonitor=false",
            "-c", "protocol.ext.allow=never",
            "-c", "protocol.file.allow=" + ("always" if local_fetch else "never"),
            "-c", "credential.helper=",
        ]  # fmt: skip
        # The workspace belongs to the tools uid; the local fetch trusts it through _trust_file.
        if not local_fetch and self.credentials_file is not None:
            args += ["-c", f"credential.helper=store --file={self.credentials_file}"]
        return args

    async def _git(self, *args: str, local_fetch: bool = False) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            "git",
            *self._config(local_fetch=local_fetch),
            *args,
            cwd=str(self.mirror),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=self._env(local_fetch=local_fetch),
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout=GIT_TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()
            return 124, f"git {args[1] if len(args) > 1 else ''} timed out"
        return process.returncode or 0, out.decode("utf-8", "replace").strip()

    def _in_mirror(self, *args: str) -> tuple[str, ...]:
        return ("--git-dir", str(self.mirror), *args)

    async def _fetch_workspace(self) -> GitResult:
        if not (self.mirror / "HEAD").exists():
            self.mirror.mkdir(parents=True, exist_ok=True)
            # No templates: the mirror has no hooks, not even samples.
            code, out = await self._git("init", "--bare", "-q", "--template=", str(self.mirror))
            if code:
                return GitResult(False, f"cannot prepare the push mirror: {out}")
        code, out = await self._git(
            *self._in_mirror(
                "fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
                str(self.workspace), "+HEAD:refs/corral/head", "+refs/heads/*:refs/corral/heads/*",
            ),
            local_fetch=True,
        )  # fmt: skip
        if code:
            return GitResult(False, f"cannot read the workspace's commits: {out}")
        code, head = await self._git(
            *self._in_mirror("rev-parse", "--verify", "-q", "refs/corral/head^{commit}")
        )
        return GitResult(code == 0, head, revision=head if code == 0 else "")

    async def push_head(self, branch: str) -> GitResult:
        """Push the workspace's HEAD to `branch` on the pinned remote, fast-forward only."""
        refused = self.remote_refusal()
        if refused is not None:
            return GitResult(False, refused)
        fetched = await self._fetch_workspace()
        if not fetched.ok:
            return fetched
        return await self._push(fetched.revision, branch)

    async def push_revision(self, revision: str, branch: str) -> GitResult:
        """Push one commit of the workspace (by full SHA) to `branch`, fast-forward only."""
        refused = self.remote_refusal()
        if refused is not None:
            return GitResult(False, refused)
        fetched = await self._fetch_workspace()
        if not fetched.ok:
            return fetched
        code, _ = await self._git(*self._in_mirror("cat-file", "-e", f"{revision}^{{commit}}"))
        if code:
            return GitResult(False, f"revision {revision} is not a commit in the workspace")
        return await self._push(revision, branch)

    # ------------------------------------------------------------- delivery (_delivery.py)

    async def fetch_workspace(self) -> GitResult:
        """The agent's commits into the mirror; `revision` is the workspace's HEAD."""
        return await self._fetch_workspace()

    async def fetch_base(self, ref: str) -> GitResult:
        """The remote's `ref` (a branch, tag, HEAD or full SHA) into the mirror as
        refs/corral/base: the head a first delivery must descend from."""
        assert self.remote_url is not None
        code, out = await self._git(
            *self._in_mirror(
                "fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
                self.remote_url, f"+{ref}:refs/corral/base",
            )
        )  # fmt: skip
        if code:
            return GitResult(False, f"cannot read {ref!r} from the remote: {out}")
        code, head = await self._git(
            *self._in_mirror("rev-parse", "--verify", "-q", "refs/corral/base^{commit}")
        )
        return GitResult(code == 0, head, revision=head if code == 0 else "")

    async def has_commit(self, revision: str) -> bool:
        code, _ = await self._git(*self._in_mirror("cat-file", "-e", f"{revision}^{{commit}}"))
        return code == 0

    async def descends(self, ancestor: str, revision: str) -> bool:
        """Whether `revision` has `ancestor` in its history (or is it)."""
        code, _ = await self._git(
            *self._in_mirror("merge-base", "--is-ancestor", ancestor, revision)
        )
        return code == 0

    async def push_to(self, revision: str, branch: str) -> GitResult:
        """Push a commit already in the mirror to `branch`, fast-forward only."""
        refused = self.remote_refusal()
        if refused is not None:
            return GitResult(False, refused)
        return await self._push(revision, branch)

    async def _push(self, revision: str, branch: str) -> GitResult:
        assert self.remote_url is not None
        code, out = await self._git(
            *self._in_mirror(
                "push", "--porcelain", "--no-verify", "--no-recurse-submodules",
                self.remote_url, f"{revision}:refs/heads/{branch}",
            )
        )  # fmt: skip
        return GitResult(code == 0, out, revision=revision)
