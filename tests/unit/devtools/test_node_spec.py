"""The local node's mount-path remapping."""

from __future__ import annotations

from corral_dev._node_spec import remap


def test_whole_prefixes_only_and_longest_wins() -> None:
    mounts = [("/work", "/h/work"), ("/workspace", "/h/ws"), ("/workspace/cache", "/h/cache")]
    assert remap("/workspace/a /work/b /workspacex /workspace/cache/c", mounts) == (
        "/h/ws/a /h/work/b /workspacex /h/cache/c"
    )


def test_a_host_dir_that_looks_like_a_mount_is_not_rewritten_again() -> None:
    # The node's workdir is under /tmp and the pod mounts /tmp too.
    mounts = [("/tmp", "/tmp/node/pods/p/volumes/tmp"), ("/secrets", "/tmp/node/pods/p/s")]
    assert remap("/secrets/token", mounts) == "/tmp/node/pods/p/s/token"
    assert remap("TMPDIR=/tmp", mounts) == "TMPDIR=/tmp/node/pods/p/volumes/tmp"


def test_backslashes_in_host_paths_are_literal() -> None:
    assert remap("/data/x", [("/data", r"C:\d\1")]) == r"C:\d\1/x"
