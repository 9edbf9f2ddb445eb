"""What a Session changed, read as people read a pull request: for each turn, the revision it
delivered, the files it changed and the patch (docs/console.md).

Read from git and never from the sandbox: the pod's workspace is the agent's, and gone with the
pod. The archive keeps the transcript, not the commits, so the console reads them from where
delivery put them (docs/delivery.md):

- `RemoteChanges`: the Session's remote (`spec.workspace.repo`), fetched read-only, shallow and
  anonymously into a bare cache directory of the console's own: the delivered revision
  (`status.delivery.revision`) and the ref the work started from (`spec.workspace.ref`). Only
  `https://`, `http://` and `git://` remotes: never a path or `file://` (the console's own
  filesystem), never ssh (it has no key), no credential of anyone's, no redirect followed, no
  configuration but its command line's; every git run has a timeout and its output a cap, and
  what git says is never shown (each failure is one fixed sentence: git's messages may quote
  the URL with its userinfo).
- `read_changes`: the reading itself over any git directory holding the commits (that cache,
  or the repository a `corral run` committed to).

Turns are told apart by the trailers the harness writes into each turn's commit
(`Corral-Session:`, `Corral-Submission:`): a turn's changes run from the previous turn's commit
(or the base) to its own. Commits the agent made itself belong to the turn whose commit follows
them; commits after the last trailer are the work delivered without a commit of the harness's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

Obj = dict[str, Any]

# How much is read: bounded whatever the remote holds.
MAX_COMMITS = 200  # the fetch's depth, and the commits walked from the revision
MAX_TURNS = 50  # the latest ones; older turns are counted
MAX_FILES = 300  # listed per turn
MAX_TURN_PATCH_BYTES = 256 * 1024
MAX_PATCH_BYTES = 1024 * 1024  # over every turn of a Session
FETCH_SECONDS = 60.0
GIT_SECONDS = 15.0
CACHE_BYTES = 1024 * 1024 * 1024  # the cache directory; least recently read remotes go first
RESULTS_KEPT = 64
FAILURE_SECONDS = 30.0  # a failed read is not retried sooner (the page refreshes every 2 s)

SCHEMES = ("https", "http", "git")
_SHA = re.compile(r"^[0-9a-f]{40}$")
# A ref as a Session names it (`main`, `refs/heads/main`, `HEAD`, a tag, a SHA): nothing git
# would read as an option or a refspec.
_REF = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/@-]{1,255}$")
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class ChangesUnavailable(Exception):
    """Why the changes cannot be shown, in one sentence fit for the page."""


class GitTimedOut(ChangesUnavailable):
    """A git run was stopped at its timeout."""


def display_url(url: str) -> str:
    """The remote as a page may show it: no userinfo (a token in `https://user:token@...`),
    no query, no fragment."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.hostname:
        return url if "@" not in url else url.rsplit("@", 1)[-1]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def remote_of(repo: str) -> str:
    """The Session's repo as the remote the console reads, or ChangesUnavailable: a network
    remote, without the userinfo a URL may carry (the console reads anonymously, with no
    credential of anyone's, a token written into the URL included)."""
    parts = urlsplit(repo)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ChangesUnavailable(
            "the console reads https://, http:// and git:// remotes only; "
            f"this Session's repository is {display_url(repo)!r}"
        )
    return display_url(repo)


# -------------------------------------------------------------------------------- running git


def git_env(home: Path) -> dict[str, str]:
    """An environment in which git reads no configuration but its command line's, asks nobody
    for a password and speaks only the remote protocols the console reads."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "GIT_ALLOW_PROTOCOL": ":".join(SCHEMES),
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_OPTIONAL_LOCKS": "0",
    }


# On every run: no hooks, no credential helper, no redirect, no external diff or textconv.
_GIT_FLAGS = (
    "-c", "core.hooksPath=/dev/null", "-c", "credential.helper=",
    "-c", "http.followRedirects=false", "-c", "protocol.version=2", "-c", "gc.auto=0",
    "-c", "maintenance.auto=false", "-c", "diff.external=", "-c", "core.quotePath=false",
)  # fmt: skip


@dataclass(frozen=True)
class GitRun:
    code: int
    out: bytes
    err: bytes
    truncated: bool  # the output was cut at the cap


def run_git(
    git_dir: Path, args: list[str], env: dict[str, str], timeout: float, limit: int = 4 << 20
) -> GitRun:
    """`git -C git_dir ARGS`, stopped after `timeout` seconds, its stdout read up to `limit`
    bytes (the process is stopped there). stderr goes to a file: a pipe left full would stall
    git while its stdout is read."""
    binary = shutil.which("git", path=env["PATH"])
    if binary is None:
        raise ChangesUnavailable("git is not installed where the console runs")
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [binary, "-C", str(git_dir), *_GIT_FLAGS, *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env,
        )  # fmt: skip
        late = threading.Event()

        def stop() -> None:
            late.set()
            proc.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            assert proc.stdout is not None
            out = proc.stdout.read(limit + 1)
            truncated = len(out) > limit
            if truncated:
                proc.kill()
            proc.stdout.close()
            code = proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        if late.is_set():
            raise GitTimedOut(f"git took longer than {timeout:.0f} s")
        return GitRun(code, out[:limit], err.read(4096), truncated)


def _fetch_failure(err: bytes) -> str:
    """git's complaint as one fixed sentence: never its own words (they may hold the URL)."""
    text = err.decode("utf-8", "replace").lower()
    if "terminal prompts disabled" in text or "authentication" in text or "403" in text:
        return "the remote asks for credentials; the console reads remotes anonymously"
    if "not our ref" in text or "couldn't find remote ref" in text or "no such remote" in text:
        return "the remote no longer has the delivered revision (the branch was rewritten?)"
    if "not found" in text or "does not appear to be a git repository" in text:
        return "the remote has no such repository"
    if "redirect" in text:
        return "the remote answered with a redirect, which the console does not follow"
    if "could not resolve" in text or "unable to connect" in text or "connection" in text:
        return "the console cannot reach the remote"
    return "the remote could not be read"


# ------------------------------------------------------------------------------ the reading


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    session: str  # Corral-Session trailer ("" for a commit of the agent's own)
    submission: str  # Corral-Submission trailer


def _commits(git_dir: Path, env: dict[str, str], base: str | None, revision: str) -> list[Commit]:
    """The first-parent chain from `base` (exclusive) to `revision`, oldest first, at most
    MAX_COMMITS (the latest)."""
    fields = "%H%x1f%s%x1f%(trailers:key=Corral-Session,valueonly,separator=%x2c)%x1f" + (
        "%(trailers:key=Corral-Submission,valueonly,separator=%x2c)%x1e"
    )
    span = f"{base}..{revision}" if base else revision
    done = run_git(
        git_dir,
        ["log", "--first-parent", f"-n{MAX_COMMITS}", f"--format={fields}", span, "--"],
        env, GIT_SECONDS,
    )  # fmt: skip
    if done.code != 0:
        raise ChangesUnavailable("the delivered revision is not in the repository")
    found = []
    for record in done.out.decode("utf-8", "replace").split("\x1e"):
        parts = record.strip("\n").split("\x1f")
        if len(parts) == 4 and _SHA.match(parts[0]):
            sha, subject, session, submission = parts
            found.append(Commit(sha, subject, session.strip(), submission.strip()))
    return list(reversed(found))


def _parent(git_dir: Path, env: dict[str, str], sha: str) -> str | None:
    done = run_git(git_dir, ["rev-parse", "--verify", "-q", f"{sha}^1^{{commit}}"], env,
                   GIT_SECONDS)  # fmt: skip
    found = done.out.decode().strip()
    return found if done.code == 0 and _SHA.match(found) else None


def _files(git_dir: Path, env: dict[str, str], old: str, new: str) -> list[Obj]:
    """Each changed file: path (and oldPath for a rename), status (A, M, D, R, C, T), lines
    added and removed (None for a binary file), in git's order."""
    statuses = run_git(git_dir, ["diff", "--no-ext-diff", "-M", "--name-status", "-z", old, new],
                       env, GIT_SECONDS)  # fmt: skip
    counts = run_git(git_dir, ["diff", "--no-ext-diff", "-M", "--numstat", "-z", old, new],
                     env, GIT_SECONDS)  # fmt: skip
    if statuses.code != 0 or counts.code != 0:
        raise ChangesUnavailable("git could not compare the turn's revisions")
    files: list[Obj] = []
    fields = statuses.out.decode("utf-8", "replace").split("\0")
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i][:1]
        if status in ("R", "C"):
            files.append({"status": status, "oldPath": fields[i + 1], "path": fields[i + 2]})
            i += 3
        else:
            files.append({"status": status, "path": fields[i + 1]})
            i += 2
    numbers = counts.out.decode("utf-8", "replace").split("\0")
    i, n = 0, 0
    while i < len(numbers) and numbers[i] and n < len(files):
        added, removed, path = [*numbers[i].split("\t", 2), "", ""][:3]
        i += 1 if path else 3  # a rename: the two paths follow, NUL-separated
        binary = added == "-"
        files[n].update(
            added=None if binary else int(added or 0),
            removed=None if binary else int(removed or 0),
            binary=binary,
        )
        n += 1
    return files


def _turn(
    git_dir: Path, env: dict[str, str], old: str, commits: list[Commit], budget: int
) -> tuple[Obj, int]:
    """One turn's record and the patch bytes it used of `budget`."""
    last = commits[-1]
    files = _files(git_dir, env, old, last.sha)
    limit = max(0, min(MAX_TURN_PATCH_BYTES, budget))
    patch = b""
    cut = bool(files) and limit == 0
    if limit:
        done = run_git(
            git_dir,
            ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "-M", "-U3", old, last.sha],
            env, GIT_SECONDS, limit,
        )  # fmt: skip
        if done.code != 0 and not done.truncated:
            raise ChangesUnavailable("git could not compare the turn's revisions")
        patch, cut = done.out, done.truncated
    turn = {
        "submission": last.submission or None,
        "session": last.session or None,
        "from": None if old == EMPTY_TREE else old,
        "revision": last.sha,
        "commits": [{"sha": c.sha, "subject": c.subject} for c in commits],
        "files": files[:MAX_FILES],
        "moreFiles": max(0, len(files) - MAX_FILES),
        "added": sum(f.get("added") or 0 for f in files),
        "removed": sum(f.get("removed") or 0 for f in files),
        "patch": patch.decode("utf-8", "replace"),
        "patchTruncated": cut,
    }
    return turn, len(patch)


def _group(commits: list[Commit]) -> list[list[Commit]]:
    """Commits into turns: each group ends at a commit of the harness's (one with a
    Corral-Submission trailer); what follows the last one is a group of its own."""
    groups: list[list[Commit]] = [[]]
    for commit in commits:
        groups[-1].append(commit)
        if commit.submission:
            groups.append([])
    return [g for g in groups if g]


def read_changes(
    git_dir: Path, env: dict[str, str], base: str | None, revision: str, session: str
) -> Obj:
    """The turns from `base` to `revision` in `git_dir`. Without a base, the work starts at the
    parent of the oldest commit of this Session's (by its trailer) in reach."""
    commits = _commits(git_dir, env, base, revision)
    note = None
    if base is None:
        ours = [i for i, c in enumerate(commits) if c.session == session]
        base = _parent(git_dir, env, commits[ours[0]].sha) if ours else None
        if base is None:
            raise ChangesUnavailable(
                "where the session's work starts cannot be told: the remote has not its ref "
                "and no commit within reach carries its Corral-Session trailer"
            )
        commits = commits[ours[0] :]
        note = "the base is the parent of the session's first commit (its ref was not found)"
    if len(commits) >= MAX_COMMITS:
        note = f"only the latest {MAX_COMMITS} commits are shown"
    groups = _group(commits)
    older = max(0, len(groups) - MAX_TURNS)
    start = base or EMPTY_TREE
    if older:
        start = groups[older - 1][-1].sha
        groups = groups[older:]
    turns, budget = [], MAX_PATCH_BYTES
    for group in groups:
        turn, used = _turn(git_dir, env, start, group, budget)
        turns.append(turn)
        budget -= used
        start = group[-1].sha
    return {
        "base": base,
        "revision": revision,
        "turns": turns,
        "olderTurns": older,
        "note": note,
    }


# ------------------------------------------------------------------- from the Session's remote


@dataclass
class RemoteChanges:
    """Reads Sessions' delivered work from their remotes into `cache_dir` (one bare repository
    per remote), remembering each answer: a revision never changes."""

    cache_dir: Path
    fetch_seconds: float = FETCH_SECONDS
    cache_bytes: int = CACHE_BYTES
    _results: OrderedDict[tuple[str, str, str], tuple[float, Obj]] = field(
        default_factory=OrderedDict, repr=False
    )
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def read(self, session: Obj) -> Obj:
        """The Session's changes (see `read_changes`), or `{"unavailable": why}`. Blocking:
        call it in a thread."""
        spec, st = session.get("spec") or {}, session.get("status") or {}
        workspace = spec.get("workspace") or {}
        delivery = st.get("delivery") or {}
        repo, revision = str(workspace.get("repo") or ""), str(delivery.get("revision") or "")
        ref = str(workspace.get("ref") or "HEAD")
        shown = {"remote": display_url(repo), "branch": delivery.get("branch")}
        if not _SHA.match(revision):
            why = delivery.get("message")
            said = f"nothing delivered: {why}" if why else "nothing delivered yet"
            return {**shown, "unavailable": said}
        key = (repo, revision, ref)
        with self._guard:
            kept = self._results.get(key)
        if kept is not None and (kept[1].get("unavailable") is None or kept[0] > time.time()):
            return kept[1]
        try:
            found: Obj = {**shown, **self._read(remote_of(repo), revision, ref, session)}
            until = float("inf")
        except ChangesUnavailable as why:
            found = {**shown, "revision": revision, "unavailable": str(why)}
            until = time.time() + FAILURE_SECONDS
        with self._guard:
            self._results[key] = (until, found)
            self._results.move_to_end(key)
            while len(self._results) > RESULTS_KEPT:
                self._results.popitem(last=False)
        return found

    def _read(self, url: str, revision: str, ref: str, session: Obj) -> Obj:
        repo = self.cache_dir / hashlib.sha256(url.encode()).hexdigest()[:24]
        with self._lock(repo):
            env = git_env(repo)
            if not (repo / "HEAD").exists():
                repo.mkdir(parents=True, exist_ok=True)
                if run_git(repo, ["init", "-q", "--bare"], env, GIT_SECONDS).code != 0:
                    raise ChangesUnavailable("the console's git cache cannot be written")
            base_ref = self._fetch(repo, env, url, revision, ref)
            base = None
            if base_ref is not None:
                done = run_git(repo, ["merge-base", revision, base_ref], env, GIT_SECONDS)
                found = done.out.decode().strip()
                base = found if done.code == 0 and _SHA.match(found) else None
            os.utime(repo)  # the eviction's clock: when it was last read
            changes = read_changes(repo, env, base, revision, session["metadata"]["name"])
        self._evict(keep=repo)
        return changes

    def _fetch(
        self, repo: Path, env: dict[str, str], url: str, revision: str, ref: str
    ) -> str | None:
        """The revision (and the ref the work started from, when the remote has it) into the
        cache, shallow; returns the ref's local name, or None when only the revision came."""
        mine = f"refs/corral/revisions/{revision}"
        if run_git(repo, ["rev-parse", "--verify", "-q", f"{mine}^{{commit}}"], env,
                   GIT_SECONDS).code != 0:  # fmt: skip
            got = self._fetch_one(repo, env, url, f"+{revision}:{mine}")
            if got is not None:
                raise ChangesUnavailable(got)
        if not _REF.match(ref):
            return None
        base = f"refs/corral/bases/{hashlib.sha256(ref.encode()).hexdigest()[:16]}"
        # The ref moves: fetched again on each new revision (a revision is read once).
        return base if self._fetch_one(repo, env, url, f"+{ref}:{base}") is None else None

    def _fetch_one(self, repo: Path, env: dict[str, str], url: str, refspec: str) -> str | None:
        args = ["fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
                f"--depth={MAX_COMMITS}", "--", url, refspec]  # fmt: skip
        try:
            done = run_git(repo, args, env, self.fetch_seconds)
        except GitTimedOut:
            return f"the remote took longer than {self.fetch_seconds:.0f} s to answer"
        return None if done.code == 0 else _fetch_failure(done.err)

    @contextlib.contextmanager
    def _lock(self, repo: Path) -> Iterator[None]:
        """One reader of a cache repository at a time, in this process and across processes
        sharing the directory."""
        with self._guard:
            lock = self._locks.setdefault(str(repo), threading.Lock())
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with lock, open(self.cache_dir / f"{repo.name}.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            yield

    def _evict(self, keep: Path) -> None:
        """Remove the least recently read remotes while the cache is over its size."""
        repos = [p for p in self.cache_dir.iterdir() if p.is_dir()]
        sizes = {p: _size(p) for p in repos}
        total = sum(sizes.values())
        for repo in sorted(repos, key=lambda p: p.stat().st_mtime):
            if total <= self.cache_bytes:
                return
            if repo == keep:
                continue
            with self._lock(repo):
                shutil.rmtree(repo, ignore_errors=True)
            total -= sizes[repo]


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
