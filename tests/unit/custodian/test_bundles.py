"""The agent's commits reach the custodian as a git bundle, never as a repository: the real
custodian takes a bundle the test writes as the tools side does, unpacks it into its own
mirror and delivers or pushes only what it holds (docs/delivery.md). The attacks on the
bundle itself are in tests/attack/test_bundle_attacks.py."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral_api.wire import BundleAccepted, BundleBase
from corral_custodian._bundle import BundleRefused, read_header, scan_pack, write_capped
from corral_custodian._git import EXCERPT_LIMIT, MAX_PACKS, REASONS, classify, excerpt
from corral_dev.ports import free_port

from ._bundle_rig import BRANCH, bundle_rig
from ._custodian_proc import git

pytestmark = pytest.mark.timeout(120)


def test_a_bundle_is_taken_delivered_and_the_next_one_starts_from_the_push(
    tmp_path: Path,
) -> None:
    with bundle_rig(tmp_path) as rig:
        main = git(rig.remote, "rev-parse", "refs/heads/main")
        # Before any push the base is the Session's ref as the remote has it (here HEAD).
        assert rig.base() == main
        first = rig.commit("a.txt", "one\n")
        data = rig.bundle(main)
        answer = rig.send(data, first)
        assert answer.status_code == 200, answer.text
        assert BundleAccepted.model_validate(answer.json()) == BundleAccepted(
            revision=first, bytes=len(data)
        )
        assert rig.incoming_left() == []  # the upload is removed once taken
        record = rig.deliver(first)
        assert record["state"] == "Delivered", record
        assert rig.remote_head() == first and record["revision"] == first

        # The custodian's known head is now its push: the next bundle holds one commit.
        assert BundleBase.model_validate(rig.client.get("/agents/c1/bundle-base").json()).base == (
            first
        )
        second = rig.commit("b.txt", "two\n")
        assert rig.send(rig.bundle(first), second).status_code == 200
        assert rig.deliver(second)["state"] == "Delivered"
        assert rig.remote_head() == second
        # Nothing new: an empty upload names a revision the mirror holds.
        empty = rig.send(b"", second)
        assert empty.status_code == 200 and empty.json()["bytes"] == 0
        assert rig.deliver(None)["state"] == "NothingToDeliver"
        # The bundle's ref names never became refs of the mirror.
        assert all(ref.startswith("refs/corral/") for ref in rig.mirror_refs())


def test_a_revision_that_was_never_sent_is_not_delivered_nor_pushed(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        assert rig.push()["content"].endswith("revision_not_sent: no commits were sent")
        local = rig.commit("a.txt", "never sent\n")
        record = rig.deliver(local)
        assert record["state"] == "Failed"
        assert record["message"] == (
            f"not delivered: revision_not_sent: revision {local} was not sent"
        )
        unknown = rig.send(b"", local)
        assert unknown.status_code == 400
        assert unknown.json()["error"] == "revision_not_sent"
        assert rig.remote_head() is None


def test_push_sends_the_last_sent_tip_and_a_rewrite_is_refused_without_gits_output(
    tmp_path: Path,
) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        one = rig.commit("a.txt", "one\n")
        assert rig.send(rig.bundle(base), one).status_code == 200
        pushed = rig.push()
        assert pushed == {"content": f"pushed {one} to {BRANCH}", "isError": False,
                          "endsTurn": False}  # fmt: skip
        assert rig.remote_head() == one
        # The agent rewrites history and sends it: push never forces.
        git(rig.work, "reset", "-q", "--hard", "HEAD~1")
        other = rig.commit("b.txt", "other\n")
        assert rig.send(rig.bundle(base), other).status_code == 200
        refused = rig.push()
        assert refused["isError"] is True
        content = refused["content"]
        assert content.startswith(f"git push to {BRANCH} failed: non_fast_forward: "), content
        assert len(content) < 260 and "hint:" not in content
        assert rig.remote_head() == one


def test_a_remote_that_refuses_is_named_by_reason_with_a_short_excerpt(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        hook = rig.remote / "hooks" / "pre-receive"
        hook.write_text("#!/bin/sh\necho 'protected: pushes are closed' >&2\n"
                        "head -c 5000 /dev/zero | tr '\\0' x >&2\nexit 1\n")  # fmt: skip
        hook.chmod(0o755)
        base = rig.base()
        one = rig.commit("a.txt", "one\n")
        assert rig.send(rig.bundle(base), one).status_code == 200
        record = rig.deliver(one)
        assert record["state"] == "Failed"
        message = record["message"]
        assert message.startswith(f"git push to {BRANCH} failed: remote_rejected: "), message
        assert "pushes are closed" in message
        assert len(message) <= len(f"git push to {BRANCH} failed: remote_rejected: ") + (
            EXCERPT_LIMIT
        )


def test_an_unreachable_remote_fails_the_base_with_its_reason(tmp_path: Path) -> None:
    dead = f"git://127.0.0.1:{free_port()}/remote.git"
    with bundle_rig(tmp_path, CORRAL_GIT_REMOTE_URL=dead) as rig:
        answer = rig.client.get("/agents/c1/bundle-base")
        assert answer.status_code == 502
        assert answer.json()["error"] == "remote_unreachable", answer.json()


def test_without_a_remote_the_base_is_the_last_sent_tip(tmp_path: Path) -> None:
    # `corral run` without a network remote: nothing is pushed, bundles still chain.
    with bundle_rig(tmp_path, CORRAL_GIT_REMOTE_URL="") as rig:
        assert rig.base() is None
        one = rig.commit("a.txt", "one\n")
        assert rig.send(rig.bundle(None), one).status_code == 200
        assert rig.base() == one
        record = rig.deliver(one)
        assert record["state"] == "Failed" and record["noRemote"] is True
        assert record["attempted"] == one


# ------------------------------------------------------------------- reading, before git


async def _chunks(parts: list[bytes], path: Path, cap: int) -> AsyncIterator[bytes]:
    for part in parts:
        # What is on disk never exceeds the cap, at any point of the upload.
        assert not path.exists() or path.stat().st_size <= cap
        yield part


def test_write_capped_stops_at_the_cap_and_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "upload.bundle"
    parts = [b"x" * 400] * 10
    with pytest.raises(BundleRefused) as refused:
        asyncio.run(write_capped(_chunks(parts, path, 1000), path, 1000))
    assert refused.value.reason == "bundle_too_large"
    assert not path.exists()
    assert asyncio.run(write_capped(_chunks(parts[:2], path, 1000), path, 1000)) == 800
    assert path.stat().st_mode & 0o777 == 0o600


def test_write_capped_never_follows_a_symlink_nor_reuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "credential"
    target.write_text("secret-value-123\n")
    link = tmp_path / "upload.bundle"
    link.symlink_to(target)
    with pytest.raises(OSError):
        asyncio.run(write_capped(_chunks([b"data"], link, 10), link, 10))
    assert target.read_text() == "secret-value-123\n"


def _pack(entries: list[tuple[int, bytes, bytes]]) -> bytes:
    """A pack of (type, header size bytes, zlib data) entries with a dummy checksum."""
    out = b"PACK" + (2).to_bytes(4, "big") + len(entries).to_bytes(4, "big")
    for _, header, data in entries:
        out += header + data
    return out + b"\0" * 20


def _entry_header(kind: int, size: int) -> bytes:
    first = (kind << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(first | 0x80)
        first = size & 0x7F
        size >>= 7
    out.append(first)
    return bytes(out)


def test_an_objects_declared_size_is_refused_before_it_is_inflated() -> None:
    bomb = zlib.compress(b"\0" * (8 * 1024 * 1024))  # 8 MiB of zeros, a few KiB packed
    pack = _pack([(3, _entry_header(3, 8 * 1024 * 1024), bomb)])
    with pytest.raises(BundleRefused) as refused:
        scan_pack(io.BytesIO(pack), max_object_bytes=1024 * 1024, max_total_bytes=1 << 30)
    assert refused.value.reason == "object_too_large"
    # A size that lies is refused too (git's index-pack would also refuse it).
    liar = _pack([(3, _entry_header(3, 10), zlib.compress(b"y" * 100))])
    with pytest.raises(BundleRefused) as refused:
        scan_pack(io.BytesIO(liar), max_object_bytes=1 << 20, max_total_bytes=1 << 30)
    assert refused.value.reason == "bundle_invalid"


def test_the_header_is_read_by_the_custodian(tmp_path: Path) -> None:
    good = read_header(io.BytesIO(b"# v2 git bundle\n-" + b"a" * 40 + b" c\n" + b"b" * 40
                                  + b" refs/heads/x\n\nPACK"))  # fmt: skip
    assert good.prerequisites == ("a" * 40,) and good.ref_count == 1
    cases = {
        b"# v4 git bundle\n\n": "bundle_invalid",
        b"# v3 git bundle\n@object-format=sha1\n@filter=blob:none\n" + b"b" * 40 + b" HEAD\n\n": (
            "bundle_unsupported"
        ),
        b"# v3 git bundle\n@object-format=sha256\n\n": "bundle_unsupported",
        b"# v2 git bundle\n@filter=blob:none\n\n": "bundle_invalid",
        b"# v2 git bundle\n" + b"b" * 40 + b" HEAD": "bundle_invalid",  # no blank line
        b"# v2 git bundle\nnot a ref\n\n": "bundle_invalid",
        b"# v2 git bundle\n" + b"b" * 40 + b" " + b"r" * (1024 * 1024) + b"\n\n": (
            "bundle_invalid"
        ),
    }
    for text, reason in cases.items():
        with pytest.raises(BundleRefused) as refused:
            read_header(io.BytesIO(text))
        assert refused.value.reason == reason, text[:60]


# --------------------------------------------------------------- git's output, classified


def _real_push_failure(tmp_path: Path) -> str:
    remote = tmp_path / "r.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    work = tmp_path / "w"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    (work / "a").write_text("a")
    git(work, "add", "a")
    git(work, "commit", "-qm", "a")
    git(work, "push", "-q", "origin", "HEAD:refs/heads/x")
    git(work, "commit", "-q", "--amend", "-m", "b")
    done = subprocess.run(
        ["git", "push", "--porcelain", "origin", "HEAD:refs/heads/x"], cwd=work,
        capture_output=True, text=True, check=False,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(work), "GIT_CONFIG_NOSYSTEM": "1"},
    )  # fmt: skip
    assert done.returncode != 0
    return done.stdout + done.stderr


def test_gits_failures_map_to_the_vocabulary_with_a_short_redacted_excerpt(
    tmp_path: Path,
) -> None:
    output = _real_push_failure(tmp_path)
    assert classify(output) == "non_fast_forward"
    short = excerpt(output + "\n" + "error: " + "z" * 1000)
    assert len(short) <= EXCERPT_LIMIT and "hint:" not in short
    assert classify("fatal: unable to access 'https://h/r.git/': Could not resolve host: h") == (
        "remote_unreachable"
    )
    assert classify("fatal: Authentication failed for 'https://h/r.git/'") == (
        "authentication_failed"
    )
    assert classify("something new", "bundle_invalid") == "bundle_invalid"
    assert set(REASONS) >= {
        "remote_unreachable", "authentication_failed", "non_fast_forward", "remote_rejected",
        "bundle_invalid", "bundle_prerequisites_missing", "bundle_too_large", "object_too_large",
        "fsck_failed", "revision_not_a_commit", "timeout", "git_failed",
    }  # fmt: skip


def test_a_credential_in_gits_output_is_redacted_in_the_record_and_on_disk(
    tmp_path: Path,
) -> None:
    key = "sk-ant-canary-" + "7" * 24
    with bundle_rig(tmp_path, ANTHROPIC_API_KEY=key) as rig:
        # The remote answers with the custodian's own key in its message (as a symlink the
        # agent planted would have made git print it).
        hook = rig.remote / "hooks" / "pre-receive"
        hook.write_text(f"#!/bin/sh\necho 'error: object directory {key} does not exist' >&2\n"
                        "exit 1\n")  # fmt: skip
        hook.chmod(0o755)
        base = rig.base()
        one = rig.commit("a.txt", "one\n")
        assert rig.send(rig.bundle(base), one).status_code == 200
        record = rig.deliver(one)
        assert record["state"] == "Failed" and "remote_rejected" in record["message"]
        assert key not in record["message"] and "[redacted:" in record["message"]
        assert key not in (rig.state / "delivery.json").read_text()
        assert key not in rig.custodian.log.read_text()


def test_a_long_session_keeps_the_mirror_in_few_packs_and_loses_no_sent_revision(
    tmp_path: Path,
) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        dropped = rig.commit("dropped.txt", "rewritten away\n")
        assert rig.send(rig.bundle(base), dropped).status_code == 200
        git(rig.work, "reset", "-q", "--hard", "HEAD~1")
        known = base
        for n in range(MAX_PACKS + 2):
            tip = rig.commit(f"f{n}.txt", f"{n}\n")
            assert rig.send(rig.bundle(known), tip).status_code == 200
            known = tip
        mirror = rig.state / "custodian-push.git"
        packs = list((mirror / "objects" / "pack").glob("pack-*.idx"))
        assert len(packs) <= MAX_PACKS
        # The revision no ref names any more is still there (it could still be landed).
        assert git(mirror, "--git-dir", str(mirror), "cat-file", "-t", dropped) == "commit"
        assert rig.deliver(known)["state"] == "Delivered"
