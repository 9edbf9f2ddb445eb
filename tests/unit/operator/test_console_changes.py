"""The console's Changes (operator/corral_operator/console/changes.py, docs/console.md): a
Session's delivered work read from its remote with real git, over a real `git daemon` and a
real smart-HTTP server that asks for credentials, turn by turn by the harness's trailers, and
rendered as a pull request's patch."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral_operator.console import changes as changes_module
from corral_operator.console.changes import RemoteChanges, git_env, read_changes
from corral_operator.console.diffview import changes_html
from tests._git_http import GitHttp
from tests.unit.custodian._custodian_proc import git, git_daemon


def _commit(work: Path, subject: str, submission: str | None = None, session: str = "s1") -> str:
    git(work, "add", "-A")
    message = ["-m", subject]
    if submission:  # the harness's turn commit (corral_harness/delivery.py writes these)
        message += ["-m", f"Corral-Session: {session}\nCorral-Submission: {submission}"]
    git(work, "commit", "-q", *message)
    return git(work, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path: Path) -> dict[str, Any]:
    """A remote whose session branch holds two turns: the first edits a file, the second
    (after a commit the agent made itself) renames one, deletes one and adds a binary; main
    moved on after the session started."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "pricing.py").write_text("def total(x):\n    return x * 0.9\n")
    (work / "old_name.txt").write_text("keep me\n")
    (work / "gone.txt").write_text("delete me\n")
    base = _commit(work, "the base")
    git(work, "switch", "-q", "-c", "corral/s1")
    (work / "pricing.py").write_text("def total(x):\n    return x * 0.9 / 1  # <script>x\n")
    turn1 = _commit(work, "turn one", "sub_one")
    (work / "notes.md").write_text("the agent's own commit\n")
    wip = _commit(work, "wip (the agent's own)")
    git(work, "mv", "old_name.txt", "new_name.txt")
    git(work, "rm", "-q", "gone.txt")
    (work / "logo.bin").write_bytes(bytes(range(256)) * 4)
    turn2 = _commit(work, "turn two", "sub_two")
    git(work, "switch", "-q", "-c", "unrelated", "main")
    (work / "other.txt").write_text("another branch\n")
    unrelated = _commit(work, "another branch's work")
    git(work, "switch", "-q", "main")
    (work / "later.txt").write_text("main moved on\n")
    _commit(work, "main after the session started")
    served = tmp_path / "served"
    served.mkdir()
    git(served, "clone", "-q", "--bare", str(work), str(served / "shop.git"))
    return {"work": work, "served": served, "base": base, "turn1": turn1, "wip": wip,
            "turn2": turn2, "unrelated": unrelated}  # fmt: skip


def _session(repo: str, revision: str | None, ref: str = "main") -> dict[str, Any]:
    return {
        "metadata": {"name": "s1", "namespace": "agents"},
        "spec": {"workspace": {"repo": repo, "ref": ref, "branch": "corral/s1"}},
        "status": {"delivery": {"branch": "corral/s1", "revision": revision,
                                "state": "Delivered"}},
    }  # fmt: skip


def test_each_turn_shows_its_revision_files_and_patch_from_a_shallow_fetch(
    history: dict[str, Any], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    reader = RemoteChanges(cache)
    with git_daemon(history["served"]) as url:
        found = reader.read(_session(url + "shop.git", history["turn2"]))
    assert "unavailable" not in found, found
    # The base is where the branch left main, although main moved on since.
    assert found["base"] == history["base"] and found["revision"] == history["turn2"]
    first, second = found["turns"]
    assert (first["submission"], first["from"], first["revision"]) == (
        "sub_one", history["base"], history["turn1"])  # fmt: skip
    assert [(f["status"], f["path"], f["added"], f["removed"]) for f in first["files"]] == [
        ("M", "pricing.py", 1, 1)
    ]
    assert "+    return x * 0.9 / 1  # <script>x" in first["patch"]
    # The agent's own commit is delivered with the turn whose commit follows it.
    assert second["from"] == history["turn1"]
    assert [c["sha"] for c in second["commits"]] == [history["wip"], history["turn2"]]
    files = {f["path"]: f for f in second["files"]}
    assert files["new_name.txt"]["status"] == "R" and files["new_name.txt"]["oldPath"] == (
        "old_name.txt")  # fmt: skip
    assert files["gone.txt"]["status"] == "D" and files["notes.md"]["status"] == "A"
    assert files["logo.bin"]["binary"] is True and files["logo.bin"]["added"] is None
    # Into the console's own bare cache: the revision and the ref, nothing else of the remote.
    (repo,) = [p for p in cache.iterdir() if p.is_dir()]
    refs = git(repo, "for-each-ref", "--format=%(refname)").split()
    assert sorted(r.split("/")[2] for r in refs) == ["bases", "revisions"], refs
    assert git(repo, "rev-parse", "--is-bare-repository") == "true"
    with pytest.raises(subprocess.CalledProcessError):
        git(repo, "cat-file", "-e", history["unrelated"])

    # The same revision again: from memory, with the remote gone.
    again = reader.read(_session(url + "shop.git", history["turn2"]))
    assert again == found

    html = changes_html(found, {"sub_one": 1, "sub_two": 2}, "s1")
    assert "<b>Turn 1</b>" in html and "<b>Turn 2</b>" in html
    added = '<tr class="d-add"><td></td><td>2</td><td>+    return x * 0.9 / 1  # &lt;script&gt;x'
    assert added in html
    assert '<tr class="d-del"><td>2</td><td></td><td>-    return x * 0.9</td></tr>' in html
    assert "old_name.txt → new_name.txt" in html and "<script>x" not in html
    assert html.count('class="turn"') == 2 and 'class="muted">binary</span>' in html


def test_local_paths_file_urls_and_ssh_are_never_read(tmp_path: Path) -> None:
    """The console would read its own filesystem (or need a key) for these: it reads none."""
    cache = tmp_path / "cache"
    reader = RemoteChanges(cache)
    sha = "a" * 40
    for repo in (str(tmp_path), "file:///etc", "ssh://git@example.com/x.git", "git@host:x.git"):
        found = reader.read(_session(repo, sha))
        assert "https://, http:// and git:// remotes only" in found["unavailable"], repo
    assert not cache.exists()
    nothing = reader.read(_session("git://example.invalid/x.git", None))
    assert nothing["unavailable"] == "nothing delivered yet"
    assert '<p class="empty">Nothing delivered yet.</p>' in changes_html(nothing, {}, "s1")


def test_a_remote_asking_for_credentials_is_read_anonymously_and_no_userinfo_is_shown(
    history: dict[str, Any], tmp_path: Path
) -> None:
    token = "tok-" + "9" * 24
    with GitHttp(history["served"], "carol", token) as server:
        repo = server.url.replace("http://", f"http://carol:{token}@") + "/shop.git"
        found = RemoteChanges(tmp_path / "cache").read(_session(repo, history["turn2"]))
    assert found["unavailable"] == (
        "the remote asks for credentials; the console reads remotes anonymously"
    )
    assert server.requests and all(who is None for _, who in server.requests)
    assert token not in json.dumps(found) and "carol" not in json.dumps(found)
    assert found["remote"] == f"{server.url}/shop.git"
    assert token not in changes_html(found, {}, "s1")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_remote_that_never_answers_is_given_up_after_the_fetch_timeout(
    silent_server: int, tmp_path: Path
) -> None:
    reader = RemoteChanges(tmp_path / "cache", fetch_seconds=1.5)
    started = time.monotonic()
    found = reader.read(_session(f"git://127.0.0.1:{silent_server}/x.git", "b" * 40))
    assert time.monotonic() - started < 10
    assert found["unavailable"] == "the remote took longer than 2 s to answer"


def test_a_rewritten_branch_and_a_missing_ref_are_said_plainly(
    history: dict[str, Any], tmp_path: Path
) -> None:
    with git_daemon(history["served"]) as url:
        reader = RemoteChanges(tmp_path / "cache")
        gone = reader.read(_session(url + "shop.git", "c" * 40))
        # The ref the work started from is not on the remote: the session's own first commit
        # (by its trailer) tells where the work starts.
        found = reader.read(_session(url + "shop.git", history["turn2"], ref="no-such-branch"))
    assert "no longer has the delivered revision" in gone["unavailable"]
    assert found["base"] == history["base"]
    assert [t["submission"] for t in found["turns"]] == ["sub_one", "sub_two"]
    assert "its ref was not found" in found["note"]


def test_a_patch_over_the_cap_is_cut_and_says_so(
    history: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read where `corral run` reads it (the person's repository, no fetch)."""
    work = history["work"]
    git(work, "switch", "-q", "corral/s1")
    (work / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    big = _commit(work, "a large turn", "sub_three")
    monkeypatch.setattr(changes_module, "MAX_TURN_PATCH_BYTES", 4096)
    found = read_changes(work, git_env(work), history["base"], big, "s1")
    last = found["turns"][-1]
    assert last["patchTruncated"] is True and len(last["patch"].encode()) <= 4096
    assert last["files"][0]["added"] == 5000  # the counts are git's, not the cut patch's
    assert "The patch is cut at the size the console reads." in changes_html(found, {}, "s1")
