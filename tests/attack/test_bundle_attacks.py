"""The malicious agent writes the bundle: the tools side makes it, so every byte is the agent's.
Each attack is sent to the real custodian process as the harness would send it
(`POST /agents/{c}/bundle?revision=`), and each must be refused for its own reason with
nothing entering the custodian's mirror or reaching the remote; a bundle whose ref names lie is
taken, and only the revision the harness names counts.

The bundle is checked by the custodian before git reads it (`corral_custodian._bundle`), then
unpacked by `git index-pack --strict` into a quarantine beside the mirror (`_git.py`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..unit.custodian._bundle_rig import BundleRig, bundle_rig, raw_git
from ..unit.custodian._custodian_proc import git

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024


def _split(data: bytes) -> tuple[bytes, bytes]:
    """(header lines without the blank line, the pack)."""
    end = data.index(b"\n\n")
    return data[: end + 1], data[end + 2 :]


def _refused(rig: BundleRig, data: bytes, revision: str, status: int, reason: str) -> str:
    answer = rig.send(data, revision)
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["error"] == reason, body
    # Nothing of it entered the mirror: the revision is not deliverable, the upload is gone.
    assert rig.deliver(revision)["message"].endswith(f"revision {revision} was not sent")
    assert rig.incoming_left() == []
    assert rig.remote_head() is None
    message: str = body["reason"]
    return message


def test_a_bundle_lacking_its_prerequisites_is_refused(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        rig.base()
        never_sent = rig.commit("a.txt", "kept local\n")
        tip = rig.commit("b.txt", "on top\n")
        message = _refused(rig, rig.bundle(never_sent), tip, 400, "bundle_prerequisites_missing")
        assert never_sent in message


def test_a_bundles_ref_names_are_ignored_and_only_the_named_tip_counts(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        first = rig.commit("a.txt", "one\n")
        second = rig.commit("b.txt", "two\n")
        header, pack = _split(rig.bundle(base))
        outside = "1234567890" * 4
        lying = (
            header
            + f"{outside} refs/heads/main\n".encode()
            + f"{outside} ../../../../escape\n".encode()
            + f"{second} refs/heads/{'x' * 300}\n".encode()
            + f"{second} refs/corral/pushed\n".encode()
            + b"\n"
        )
        # A ref pointing outside the bundle does not make that object exist.
        missing = rig.send(lying + pack, outside)
        assert missing.status_code == 400 and missing.json()["error"] == "revision_not_sent"
        # The harness names `first`: that is what is taken and delivered, whatever the refs say.
        taken = rig.send(lying + pack, first)
        assert taken.status_code == 200, taken.text
        refs = rig.mirror_refs()
        assert refs[0] == "refs/corral/base" and len(refs) == 2, refs
        assert refs[1].startswith("refs/corral/sent/"), refs  # not the header's names
        record = rig.deliver(None)
        assert record["state"] == "Delivered" and record["revision"] == first
        assert rig.remote_head() == first
        assert rig.remote_head("main") == git(rig.work, "rev-parse", "main")


def test_a_pack_that_lacks_an_object_its_tree_names_is_refused(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        rig.base()
        blob = raw_git(rig.work, "hash-object", "-w", "--stdin", stdin=b"hidden\n")
        tree = raw_git(rig.work, "mktree", stdin=f"100644 blob {blob}\tx\n".encode())
        commit = raw_git(rig.work, "commit-tree", tree, "-m", "orphan")
        pack = raw_git_bytes(rig.work, "pack-objects", "--stdout", stdin=f"{commit}\n{tree}\n")
        data = f"# v2 git bundle\n{commit} HEAD\n\n".encode() + pack
        message = _refused(rig, data, commit, 400, "bundle_invalid")
        assert blob in message  # git's "did not receive expected object", excerpted


def raw_git_bytes(cwd: Path, *args: str, stdin: str) -> bytes:
    done = subprocess.run(
        ["git", *args], cwd=cwd, input=stdin.encode(), capture_output=True, check=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"},
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("compressible", [False, True], ids=["random", "zeros-bomb"])
def test_an_oversized_blob_is_refused(tmp_path: Path, compressible: bool) -> None:
    with bundle_rig(tmp_path, CORRAL_MAX_BLOB_BYTES=str(MiB)) as rig:
        base = rig.base()
        content = b"\0" * (16 * MiB) if compressible else os.urandom(2 * MiB)
        tip = rig.commit("big.bin", content)
        data = rig.bundle(base)
        if compressible:
            assert len(data) < MiB  # small on the wire, 16 MiB once inflated
        message = _refused(rig, data, tip, 413, "object_too_large")
        assert f"over the limit of {MiB}" in message


@pytest.mark.parametrize(
    ("gitmodules", "fsck_id"),
    [
        ('[submodule "x"]\n\tpath = x\n\turl = --upload-pack=touch /tmp/pwned\n', "gitmodulesUrl"),
        ('[submodule "x"]\n\tpath = -x\n\turl = https://example.invalid/x\n', "gitmodulesPath"),
        ('[submodule "../../hooks"]\n\tpath = y\n\turl = https://example.invalid/y\n',
         "gitmodulesName"),
    ],
)  # fmt: skip
def test_a_malformed_gitmodules_is_refused_by_fsck(
    tmp_path: Path, gitmodules: str, fsck_id: str
) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        tip = rig.commit(".gitmodules", gitmodules)
        message = _refused(rig, rig.bundle(base), tip, 400, "fsck_failed")
        assert fsck_id in message


def test_a_v3_bundle_with_a_filter_is_refused_before_git_reads_it(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        tip = rig.commit("a.txt", "one\n")
        header, pack = _split(rig.bundle(base))
        lines = header.split(b"\n", 1)[1]
        filtered = b"# v3 git bundle\n@object-format=sha1\n@filter=blob:none\n" + lines + b"\n"
        message = _refused(rig, filtered + pack, tip, 400, "bundle_unsupported")
        assert "@filter=blob:none" in message


def test_a_bundle_over_the_cap_is_refused_and_nothing_beyond_it_is_kept(tmp_path: Path) -> None:
    with bundle_rig(tmp_path, CORRAL_MAX_BUNDLE_BYTES=str(MiB)) as rig:
        rig.base()
        tip = rig.commit("a.txt", "one\n")

        def endless() -> Iterator[bytes]:  # chunked: no length announced, so it is counted
            for _ in range(64):
                yield b"# v2 git bundle\n" + b"x" * (64 * 1024)

        _refused(rig, endless(), tip, 413, "bundle_too_large")  # type: ignore[arg-type]
        # An announced length over the cap is refused before a byte is read.
        announced = rig.send(b"x" * (MiB + 1), tip)
        assert announced.status_code == 413 and announced.json()["error"] == "bundle_too_large"
        assert rig.incoming_left() == []


@pytest.mark.parametrize("kind", ["tree", "blob"])
def test_a_tip_that_is_not_a_commit_is_refused(tmp_path: Path, kind: str) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        rig.commit("a.txt", "one\n")
        named = git(rig.work, "rev-parse", "HEAD^{tree}" if kind == "tree" else "HEAD:a.txt")
        answer = rig.send(rig.bundle(base), named)
        assert answer.status_code == 400 and answer.json()["error"] == "revision_not_a_commit"
        assert f"is a {kind}" in answer.json()["reason"]
        assert rig.push()["content"].endswith("revision_not_sent: no commits were sent")
        assert rig.remote_head() is None


def test_garbage_and_a_truncated_pack_are_invalid(tmp_path: Path) -> None:
    with bundle_rig(tmp_path) as rig:
        base = rig.base()
        tip = rig.commit("a.txt", "one\n")
        data = rig.bundle(base)
        _refused(rig, b"#!/bin/sh\nid\n", tip, 400, "bundle_invalid")
        _refused(rig, data[: len(data) - 30], tip, 400, "bundle_invalid")
        # The same bundle, whole, is then taken: the refusals left nothing behind.
        assert rig.send(data, tip).status_code == 200
