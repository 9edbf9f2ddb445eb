"""git on the agent's behalf, without ever opening the agent's repository.

The workspace is the agent's, and so is everything in it: config, hooks, attributes, and
symlinks at `.git/objects/info/alternates` or `.git/packed-refs` that would make a git running
there read (and print) the custodian's own credential files. So the custodian never mounts,
opens or runs git in the workspace. The agent's commits reach it as data: a git bundle the
harness has the tools side write (`_bundle.py`), which `take_bundle` checks and unpacks into
the custodian's own bare mirror:

- the header is read by the custodian itself, bounded, before git sees it; a capability
  other than `@object-format=sha1` (a `@filter` bundle) is refused; the bundle's ref names are
  never used: the tip is the revision the harness names;
- every prerequisite must be a commit the mirror holds, and `git bundle verify` must agree;
- the pack's object sizes are read from its entry headers before anything is inflated
  (an object over CORRAL_MAX_BLOB_BYTES is refused), then `git index-pack --strict --fix-thin
  --max-input-size` writes it into a quarantine object directory beside the mirror, with the
  mirror as its only alternate: fsck runs on every object (a malformed `.gitmodules` is
  refused) and every link must resolve; only then does the pack move into the mirror. (git
  2.39's `fetch` from a bundle runs no fsck whatever `fetch.fsckObjects` says, so the custodian
  unpacks the bundle itself.)
- the tip must then be a commit (not a tag, tree or blob); it is recorded as the
  conversation's last sent revision (`refs/corral/sent/...`), which `push` sends.

Every command runs against the mirror (`--git-dir`, cwd in the mirror) with system and global
config off (`GIT_CONFIG_NOSYSTEM=1`, `GIT_CONFIG_GLOBAL=/dev/null`), hooks and fsmonitor off,
`protocol.file.allow=never` and ext never (nothing can make git reach a local repository),
`transfer.fsckObjects`, no automatic gc, and credentials only from the custodian's own store;
the remote is only ever `CORRAL_GIT_REMOTE_URL`, checked on every push to be a network remote
(`rules.remote_refusal`); there is no force, no tags, no delete.

git's output never leaves the custodian raw: a failure is one reason of `REASONS` with a short
excerpt that has passed `_secrets.redact` (`GitResult.message`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ._bundle import MAX_EXPANSION, BundleRefused, read_header, scan_pack
from ._secrets import redact
from .rules import remote_refusal
from .settings import register_git_credentials

GIT_TIMEOUT = 120.0
EXCERPT_LIMIT = 200

# Every reason a git operation of the custodian fails with: the one vocabulary of tool
# results, delivery records and logs (docs/vocabulary.md).
REASONS: dict[str, str] = {
    "remote_refused": "the remote is not one the custodian pushes to (a local path, file://)",
    "remote_unreachable": "the remote could not be reached, or has no repository there",
    "authentication_failed": "the remote did not accept the custodian's git credentials",
    "non_fast_forward": "the branch has commits the revision does not descend from",
    "remote_rejected": "the remote's own rules refused the update (a hook, a protection)",
    "ref_not_found": "the remote has no such ref",
    "bundle_invalid": "the upload is not a well-formed git bundle",
    "bundle_unsupported": "the bundle uses a capability the custodian refuses (@filter)",
    "bundle_prerequisites_missing": "the bundle needs commits the custodian's mirror lacks",
    "bundle_too_large": "the bundle is over CORRAL_MAX_BUNDLE_BYTES, or expands past its limit",
    "object_too_large": "an object is over CORRAL_MAX_BLOB_BYTES",
    "fsck_failed": "git fsck refused an object (a malformed .gitmodules, a broken tree...)",
    "revision_not_sent": "the revision is not in the custodian's mirror: it was never sent",
    "revision_not_a_commit": "the revision names a tag, tree or blob, not a commit",
    "timeout": "git did not finish in time",
    "git_failed": "git failed for another reason",
}

_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")

# git's messages, first match wins; what matches nothing keeps the caller's default.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("authentication_failed", re.compile(
        r"Authentication failed|could not read (Username|Password)|terminal prompts disabled|"
        r"Permission denied \(publickey|returned error: 40[13]|HTTP Basic: Access denied",
        re.I)),
    ("non_fast_forward", re.compile(
        r"\[rejected\].*(non-fast-forward|fetch first)|Updates were rejected|non-fast-forward",
        re.I)),
    ("remote_rejected", re.compile(r"\[remote rejected\]|hook declined|protected branch", re.I)),
    ("ref_not_found", re.compile(r"couldn't find remote ref|not our ref", re.I)),
    ("remote_unreachable", re.compile(
        r"Could not resolve host|Connection refused|unable to connect|unable to access|"
        r"Connection timed out|Network is unreachable|does not appear to be a git repository|"
        r"Could not read from remote repository|repository .* not found|unable to look up|"
        r"the remote end hung up", re.I)),
    ("bundle_too_large", re.compile(r"pack exceeds maximum allowed size", re.I)),
    ("fsck_failed", re.compile(
        r"fsck error|error in (blob|tree|commit|tag) |gitmodules|fsck", re.I)),
    ("bundle_prerequisites_missing", re.compile(r"lacks these prerequisite", re.I)),
)  # fmt: skip


def classify(output: str, default: str = "git_failed") -> str:
    for reason, pattern in _PATTERNS:
        if pattern.search(output):
            return reason
    return default


def excerpt(output: str) -> str:
    """The lines of git's output that say why, redacted, then cut to EXCERPT_LIMIT."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    telling = [
        line
        for line in lines
        if re.match(r"(error|fatal|remote|warning)\b|!|.*\[(remote )?rejected\]", line, re.I)
        and not line.startswith("hint:")
    ]
    text = redact(" | ".join(telling or lines[-3:]))
    return text if len(text) <= EXCERPT_LIMIT else text[: EXCERPT_LIMIT - 3] + "..."


# The only variables of the custodian's own environment its git runs see besides PATH.
_PROXY_VARIABLES = frozenset(
    {"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy",
     "GIT_PROXY_COMMAND"}
)  # fmt: skip


@dataclass(frozen=True)
class GitResult:
    ok: bool
    reason: str = ""  # a key of REASONS when not ok
    detail: str = ""  # already redacted and short
    revision: str = ""

    @property
    def message(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def _failed(reason: str, detail: str, revision: str = "") -> GitResult:
    assert reason in REASONS, reason
    detail = redact(detail)
    if len(detail) > EXCERPT_LIMIT:
        detail = detail[: EXCERPT_LIMIT - 3] + "..."
    return GitResult(False, reason, detail, revision)


def _sent_ref(conversation: str) -> str:
    # A conversation id is the harness's; hashed, it is always a valid ref name.
    return "refs/corral/sent/" + hashlib.sha256(conversation.encode()).hexdigest()[:40]


# Each bundle adds a pack to the mirror; past this many, they are repacked into one (gc never
# runs by itself there), so lookups stay fast over a long session.
MAX_PACKS = 32
PUSHED_REF = "refs/corral/pushed"  # the last revision pushed to the session's branch
BASE_REF = "refs/corral/base"


class GitPusher:
    def __init__(
        self,
        mirror: Path,
        remote_url: str | None,
        credentials_file: Path | None,
        *,
        session_branch: str | None = None,
        max_bundle_bytes: int = 64 * 1024 * 1024,
        max_blob_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.mirror = mirror
        self.remote_url = remote_url
        self.credentials_file = credentials_file
        self._remote_head: str | None = None  # the remote's default branch, once read
        self.session_branch = session_branch
        self.max_bundle_bytes = max_bundle_bytes
        self.max_blob_bytes = max_blob_bytes
        self._intake = asyncio.Lock()  # one bundle at a time: disk and memory stay bounded

    def remote_refusal(self) -> str | None:
        return remote_refusal(self.remote_url)

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # The egress gateway, when the custodian has one (main.use_egress_gateway): git's
        # https remotes read the proxy variables, git:// ones GIT_PROXY_COMMAND.
        proxy = {k: v for k, v in os.environ.items() if k in _PROXY_VARIABLES}
        return {
            **proxy,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.mirror),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "LC_ALL": "C",
            **(extra or {}),
        }

    def _config(self) -> list[str]:
        args = [
            "-c", "core.hooksPath=" + os.devnull,
            "-c", "core.fsmonitor=false",
            "-c", "protocol.ext.allow=never",
            "-c", "protocol.file.allow=never",
            "-c", "transfer.fsckObjects=true",
            "-c", "fetch.fsckObjects=true",
            "-c", "receive.fsckObjects=true",
            "-c", "gc.auto=0",
            "-c", "maintenance.auto=false",
            "-c", f"core.bigFileThreshold={self.max_blob_bytes}",
            "-c", "credential.helper=",
        ]  # fmt: skip
        if self.credentials_file is not None:
            args += ["-c", f"credential.helper=store --file={self.credentials_file}"]
        return args

    async def _git(
        self, *args: str, env: dict[str, str] | None = None, stdin: int | None = None
    ) -> tuple[int, str]:
        """Run git in the mirror; (exit code, its output) or (124, "") on a timeout. The output
        is for `classify` and `excerpt` only, never returned as it is."""
        if self.credentials_file is not None and self.remote_url in args:
            # A Secret volume's file is replaced when the Secret rotates: what git may send to
            # the remote is registered before it can appear in git's output. Only commands
            # that reach the remote read it (the mirror's own commands send nothing).
            with contextlib.suppress(ValueError):  # too short: start-up already named it
                register_git_credentials(self.credentials_file)
        process = await asyncio.create_subprocess_exec(
            "git",
            *self._config(),
            *args,
            cwd=str(self.mirror),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
            env=self._env(env),
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout=GIT_TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()
            return 124, ""
        return process.returncode or 0, out.decode("utf-8", "replace").strip()

    def _in_mirror(self, *args: str) -> tuple[str, ...]:
        return ("--git-dir", str(self.mirror), *args)

    def _failure(self, code: int, out: str, default: str, what: str) -> GitResult:
        if code == 124:
            return _failed("timeout", f"{what} took over {GIT_TIMEOUT:.0f} s")
        return _failed(classify(out, default), excerpt(out) or what)

    async def remote_default_branch(self) -> str | None:
        """The branch the remote's HEAD points at, read once (a Session whose ref is `HEAD`
        starts from it, so it may never be the session branch); None while unknown."""
        if self._remote_head is None and self.remote_refusal() is None:
            ready = await self.ensure_mirror()
            if not ready.ok:
                return None
            assert self.remote_url is not None
            code, out = await self._git("ls-remote", "--symref", self.remote_url, "HEAD")
            if code == 0:
                found = re.search(r"^ref: refs/heads/(\S+)\tHEAD$", out, re.MULTILINE)
                self._remote_head = found.group(1) if found else ""
        return self._remote_head or None

    async def ensure_mirror(self) -> GitResult:
        if self._ready():
            return GitResult(True)
        self.mirror.mkdir(parents=True, exist_ok=True)
        # No templates: the mirror has no hooks, not even samples.
        code, out = await self._git("init", "--bare", "-q", "--template=", str(self.mirror))
        if code:
            return self._failure(code, out, "git_failed", "preparing the mirror")
        return GitResult(True)

    def _ready(self) -> bool:
        return (self.mirror / "HEAD").exists()

    async def _rev(self, ref: str) -> str | None:
        if not self._ready():
            return None
        code, out = await self._git(*self._in_mirror("rev-parse", "--verify", "-q", ref))
        return out if code == 0 and _FULL_SHA.match(out) else None

    async def object_type(self, revision: str, env: dict[str, str] | None = None) -> str | None:
        if not _FULL_SHA.match(revision) or not self._ready():
            return None
        code, out = await self._git(*self._in_mirror("cat-file", "-t", revision), env=env)
        return out if code == 0 else None

    async def has_commit(self, revision: str) -> bool:
        return await self.object_type(revision) == "commit"

    async def sent(self, conversation: str) -> str | None:
        """The tip of the conversation's last accepted bundle."""
        return await self._rev(_sent_ref(conversation))

    async def pushed(self) -> str | None:
        """The last revision pushed to the session's branch, as the mirror remembers it."""
        return await self._rev(PUSHED_REF)

    # ---------------------------------------------------------------------------- bundles

    def clear_incoming(self) -> None:
        """Uploads a stopped custodian left half-written: never taken, removed at start."""
        shutil.rmtree(self.mirror.parent / "incoming", ignore_errors=True)

    def incoming_dir(self) -> Path:
        """A fresh directory (mode 0700) for one upload, beside the mirror: the custodian's own,
        on the mirror's filesystem so the checked pack moves in with a rename."""
        root = self.mirror.parent / "incoming"
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="bundle-", dir=root))

    async def take_bundle(self, path: Path | None, revision: str, conversation: str) -> GitResult:
        """Check the bundle at `path` (None: nothing was sent, `revision` must already be in
        the mirror) and unpack it into the mirror; `revision` becomes the conversation's last
        sent tip. The caller removes `path`'s directory."""
        if not _FULL_SHA.match(revision):
            return _failed("bundle_invalid", "the revision must be a full 40-hex commit id")
        async with self._intake:
            ready = await self.ensure_mirror()
            if not ready.ok:
                return ready
            quarantine: Path | None = None
            try:
                env: dict[str, str] | None = None
                if path is not None and path.stat().st_size > 0:
                    quarantine = path.parent / "objects"
                    checked = await self._unpack(path, quarantine)
                    if not checked.ok:
                        return checked
                    env = self._quarantine_env(quarantine)
                kind = await self.object_type(revision, env=env)
                if kind is None:
                    return _failed(
                        "revision_not_sent",
                        f"{revision} is neither in the bundle nor in the custodian's mirror",
                    )
                if kind != "commit":
                    return _failed("revision_not_a_commit", f"{revision} is a {kind}")
                if quarantine is not None:
                    self._migrate(quarantine)
                    await self._consolidate()
                code, out = await self._git(
                    *self._in_mirror("update-ref", _sent_ref(conversation), revision)
                )
                if code:
                    return self._failure(code, out, "git_failed", "recording the tip")
                return GitResult(True, revision=revision)
            except BundleRefused as e:
                return _failed(e.reason, e.detail)
            finally:
                if quarantine is not None:
                    shutil.rmtree(quarantine, ignore_errors=True)

    def _quarantine_env(self, quarantine: Path) -> dict[str, str]:
        return {
            "GIT_OBJECT_DIRECTORY": str(quarantine),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(self.mirror / "objects"),
        }

    async def _unpack(self, path: Path, quarantine: Path) -> GitResult:
        with path.open("rb") as stream:
            header = read_header(stream)
            offset = header.pack_offset
        missing = await self._missing_commits(header.prerequisites, path.parent / "wanted")
        if missing:
            return _failed(
                "bundle_prerequisites_missing",
                f"the mirror lacks {len(missing)} prerequisite commit(s), e.g. {missing[0]}; "
                "bundle the commits since the bundle-base",
            )
        code, out = await self._git(*self._in_mirror("bundle", "verify", "-q", str(path)))
        if code:
            return self._failure(code, out, "bundle_invalid", "git bundle verify refused it")
        limit = self.max_bundle_bytes * MAX_EXPANSION

        def scan() -> None:
            with path.open("rb") as stream:
                stream.seek(offset)
                scan_pack(stream, max_object_bytes=self.max_blob_bytes, max_total_bytes=limit)

        await asyncio.to_thread(scan)
        (quarantine / "pack").mkdir(parents=True)
        with path.open("rb") as stream:
            stream.seek(offset)
            code, out = await self._git(
                *self._in_mirror(
                    "index-pack", "--stdin", "--fix-thin", "--strict",
                    f"--max-input-size={self.max_bundle_bytes}",
                ),
                env=self._quarantine_env(quarantine),
                stdin=stream.fileno(),
            )  # fmt: skip
        if code:
            return self._failure(code, out, "bundle_invalid", "git index-pack refused the pack")
        return GitResult(True)

    async def _consolidate(self) -> None:
        packs = list((self.mirror / "objects" / "pack").glob("pack-*.idx"))
        if len(packs) > MAX_PACKS:
            # Unreachable objects are kept: a revision sent and then rewritten away may still land.
            await self._git(*self._in_mirror("repack", "-a", "-d", "-q", "--keep-unreachable"))

    async def _missing_commits(self, wanted: tuple[str, ...], scratch: Path) -> list[str]:
        """Those of `wanted` that are not commits of the mirror (one git process for all)."""
        if not wanted:
            return []
        scratch.write_text("".join(f"{oid}\n" for oid in wanted))
        with scratch.open("rb") as listing:
            code, out = await self._git(
                *self._in_mirror("cat-file", "--batch-check=%(objectname) %(objecttype)"),
                stdin=listing.fileno(),
            )
        if code:
            return list(wanted)
        commits = {line.split()[0] for line in out.splitlines() if line.endswith(" commit")}
        return [oid for oid in wanted if oid not in commits]

    def _migrate(self, quarantine: Path) -> None:
        """The checked pack into the mirror: the .pack before its .idx, which makes it seen."""
        target = self.mirror / "objects" / "pack"
        target.mkdir(parents=True, exist_ok=True)
        files = sorted((quarantine / "pack").glob("pack-*"), key=lambda p: p.suffix == ".idx")
        for file in files:
            os.replace(file, target / file.name)

    # ------------------------------------------------------------------ remote: fetch, push

    async def fetch_base(self, ref: str) -> GitResult:
        """The remote's `ref` (a branch, tag, HEAD or full SHA) into the mirror as
        refs/corral/base: the head a first delivery must descend from."""
        assert self.remote_url is not None
        ready = await self.ensure_mirror()
        if not ready.ok:
            return ready
        # The remote is the platform's repository, not the agent's: its history is taken as
        # it is (many long-lived repositories carry old fsck warnings, such as zero-padded file
        # modes, that would otherwise fail every first delivery). What the agent sends is
        # checked strictly in `take_bundle`.
        code, out = await self._git(
            "-c", "transfer.fsckObjects=false", "-c", "fetch.fsckObjects=false",
            *self._in_mirror(
                "fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
                self.remote_url, f"+{ref}:{BASE_REF}",
            )
        )  # fmt: skip
        if code:
            failed = self._failure(code, out, "git_failed", f"fetching {ref!r}")
            return _failed(failed.reason, f"cannot read {ref!r} from the remote: {failed.detail}")
        head = await self._rev(f"{BASE_REF}^{{commit}}")
        if head is None:
            return _failed("revision_not_a_commit", f"{ref!r} does not name a commit")
        return GitResult(True, revision=head)

    async def descends(self, ancestor: str, revision: str) -> bool:
        """Whether `revision` has `ancestor` in its history (or is it)."""
        if not self._ready():
            return False
        code, _ = await self._git(
            *self._in_mirror("merge-base", "--is-ancestor", ancestor, revision)
        )
        return code == 0

    async def push_to(self, revision: str, branch: str) -> GitResult:
        """Push a commit the mirror holds to `branch` on the pinned remote, fast-forward only."""
        refused = self.remote_refusal()
        if refused is not None:
            # The rule's own text (not git's), whole: it names what would be allowed.
            return GitResult(False, "remote_refused", redact(refused))
        if not await self.has_commit(revision):
            return _failed("revision_not_sent", f"{revision} is not in the custodian's mirror")
        assert self.remote_url is not None
        code, out = await self._git(
            *self._in_mirror(
                "push", "--porcelain", "--no-verify", "--no-recurse-submodules",
                self.remote_url, f"{revision}:refs/heads/{branch}",
            )
        )  # fmt: skip
        if code:
            return self._failure(code, out, "git_failed", f"pushing to {branch}")
        if branch == self.session_branch:
            await self._git(*self._in_mirror("update-ref", PUSHED_REF, revision))
        return GitResult(True, revision=revision)
