"""An earlier commit of Corral, built as the node tier builds the working tree: its chart and its
own images, for the upgrade test (tests/node/test_upgrade.py), which installs them on the real
node and upgrades to the working tree's.

`build(commit)`:

- checks `commit` out with `git worktree add --detach` at ~/.cache/corral/worktrees/<hash>
  (`CORRAL_CACHE` moves ~/.cache/corral), never inside the clone: the worktree is reused while
  it is a clean checkout of that commit, and removed, pruned and made again otherwise (a
  worktree made from a clone since deleted no longer reads);
- runs that commit's own hack/node/build-images.sh from the worktree, so the images are built
  from its Dockerfiles and sources and cached by that script's own keys. They are kept in a
  cache of their own, ~/.cache/corral/worktrees/<hash>.cache/images: the script deletes the
  older archives of each image it builds, and the working tree's images carry the same names.
  The base image archive is linked in from the node tier's cache first (the same key when the
  script's package list did not change: no second debootstrap). The build holds the working
  tree's build lock too: two builds of the project's images never run side by side, and one's
  clean-up never removes the other's image from buildah's storage.

`import_images(node, earlier)` imports the operator and sandbox archives into the real node's
containerd, as the node imports the working tree's when it starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .controlplane import REPO_ROOT
from .realnode import Artifacts, NodeError, RealNode, _script


def cache_root() -> Path:
    """Where hack/node/ keeps what it builds."""
    return Path(os.environ.get("CORRAL_CACHE") or Path.home() / ".cache" / "corral")


@dataclass(frozen=True)
class Earlier:
    """An earlier commit's checkout and the images its own build script made."""

    commit: str  # the full hash
    tree: Path  # the worktree
    artifacts: Artifacts  # its build-images.sh's KEY=VALUE lines
    seconds: float  # how long the worktree and the build took
    built: bool  # an image was built (False: every image came from the cache)

    @property
    def chart(self) -> Path:
        return self.tree / "charts" / "corral"

    @property
    def crds(self) -> Path:
        return self.chart / "crds"

    @property
    def operator_image(self) -> str:
        return self.artifacts["OPERATOR_IMAGE"]

    @property
    def sandbox_image(self) -> str:
        return self.artifacts["SANDBOX_IMAGE"]


def _git(*args: str, cwd: Path = REPO_ROOT, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    if check and done.returncode != 0:
        raise NodeError(f"git {' '.join(args)} (in {cwd}) failed: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """flock(2) on `path`, as the hack/node scripts take theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def resolve(commit: str) -> str:
    """`commit`'s full hash in this clone; NodeError when the clone lacks it (a shallow one)."""
    done = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
    if done.returncode != 0:
        raise NodeError(
            f"commit {commit} is not in this clone's history ({REPO_ROOT}); a shallow clone "
            "needs `git fetch --unshallow`"
        )
    return done.stdout.strip()


def _usable(tree: Path, full: str) -> bool:
    """`tree` is a clean, complete checkout of `full` that git still reads."""
    if not (tree / ".git").exists():
        return False
    head = _git("rev-parse", "HEAD", cwd=tree, check=False)
    if head.returncode != 0 or head.stdout.strip() != full:
        return False
    status = _git("status", "--porcelain", "--untracked-files=all", cwd=tree, check=False)
    return status.returncode == 0 and not status.stdout.strip()


def worktree(full: str, root: Path) -> Path:
    """The worktree of `full` under `root`, made (again) unless it is usable as it is."""
    tree = root / full
    if _usable(tree, full):
        return tree
    if tree.exists():
        _git("worktree", "remove", "--force", str(tree), check=False)
        shutil.rmtree(tree, ignore_errors=True)
    _git("worktree", "prune")
    _git("worktree", "add", "--detach", str(tree), full)
    if not _usable(tree, full):
        raise NodeError(f"git worktree add made no clean checkout of {full} at {tree}")
    return tree


def _seed_base(images: Path, into: Path) -> None:
    """Link the node tier's base image archives into the earlier build's cache."""
    into.mkdir(parents=True, exist_ok=True)
    for archive in images.glob("corral-base-*.oci.tar"):
        target = into / archive.name
        if not target.exists():
            try:
                os.link(archive, target)
            except OSError:
                shutil.copy2(archive, target)


def build(commit: str, *, timeout: float = 3600) -> Earlier:
    """`commit`'s worktree and images (see the module's doc)."""
    start = time.monotonic()
    full = resolve(commit)
    cache = cache_root()
    root = cache / "worktrees"
    own_cache = root / f"{full}.cache"
    with _locked(root / f".{full}.lock"):
        tree = worktree(full, root)
        _seed_base(cache / "images", own_cache / "images")
        before = set(os.listdir(own_cache / "images"))
        env = {**os.environ, "CORRAL_CACHE": str(own_cache)}
        with _locked(cache / ".build-images.lock"):
            values = _script("build-images.sh", timeout, hack=tree / "hack" / "node", env=env)
        built = bool(set(os.listdir(own_cache / "images")) - before)
    return Earlier(full, tree, Artifacts(values), time.monotonic() - start, built)


def import_images(node: RealNode, earlier: Earlier) -> float:
    """Import `earlier`'s operator and sandbox images into `node`'s containerd; the seconds."""
    start = time.monotonic()
    for name in ("OPERATOR", "SANDBOX"):
        archive = earlier.artifacts[f"{name}_OCI"]
        node.ctr("images", "import", "--no-unpack=false", archive, timeout=300)
    return time.monotonic() - start
