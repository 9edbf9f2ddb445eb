"""Where `corral run` keeps what it writes: under the person's state directory, never in a
workspace, so nothing of it (secrets, logs, transcripts, the memory database) can be committed.

The state home is `$XDG_STATE_HOME/corral` (an absolute `XDG_STATE_HOME`, as the XDG spec
asks), else `~/.local/state/corral`. A run's directory is `runs/<session>-<time>` below it; the
memory database of every run started from one directory is `memory/<name>-<digest>.db` (the
digest of that directory's path). Secrets are created 0600 under a fresh name (`O_EXCL`, no
symlink followed) and renamed into place: no moment when another mode applies.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

STATE_HOME_ENV = "XDG_STATE_HOME"
MEMORY_ENV = "CORRAL_MEMORY_SQLITE"


def state_home(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/corral`, else `~/.local/state/corral`."""
    env = os.environ if env is None else env
    base = env.get(STATE_HOME_ENV) or ""
    if not os.path.isabs(base):
        home = env.get("HOME") or str(Path.home())
        base = os.path.join(home, ".local", "state")
    return Path(base) / "corral"


def default_run_dir(session: str, env: Mapping[str, str] | None = None) -> Path:
    return state_home(env) / "runs" / f"{session}-{time.strftime('%Y%m%d-%H%M%S')}"


def memory_db(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """$CORRAL_MEMORY_SQLITE, else the database of every run started from this directory
    (docs/memory.md), so a later run's Agent recalls what an earlier one wrote."""
    env = os.environ if env is None else env
    if env.get(MEMORY_ENV):
        return Path(env[MEMORY_ENV]).resolve()
    here = (cwd or Path.cwd()).resolve()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", here.name).strip("-") or "root"
    digest = hashlib.sha256(str(here).encode()).hexdigest()[:12]
    return state_home(env) / "memory" / f"{slug}-{digest}.db"


def is_inside(path: Path, tree: Path) -> bool:
    """Whether `path` is `tree` or below it, symlinks resolved on both sides (a path that does
    not exist yet is resolved as far as it exists)."""
    return path.resolve().is_relative_to(tree.resolve())


def write_secret(path: Path, value: str) -> Path:
    """`value` in `path`, mode 0600 from its creation, in a 0700 directory."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if directory.stat().st_mode & 0o077:
        directory.chmod(0o700)  # one that existed already (a resumed run's, or made by hand)
    fresh = directory / f".{path.name}.{secrets.token_hex(8)}"
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(value)
        os.replace(fresh, path)
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise
    return path
