"""Where `corral run` writes: the person's state home, never a workspace; secrets 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral_cli._localpaths import (
    default_run_dir,
    is_inside,
    memory_db,
    state_home,
    write_secret,
)


def test_the_state_home_follows_xdg_and_falls_back_to_local_state(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert state_home({"XDG_STATE_HOME": "/srv/state", "HOME": home}) == Path("/srv/state/corral")
    # A relative XDG_STATE_HOME is ignored, as the XDG spec asks.
    for env in ({"XDG_STATE_HOME": "rel/state", "HOME": home}, {"HOME": home}):
        assert state_home(env) == Path(home) / ".local" / "state" / "corral"
    run = default_run_dir("fix-bug", {"HOME": home})
    assert run.parent == Path(home) / ".local" / "state" / "corral" / "runs"
    assert run.name.startswith("fix-bug-")


def test_the_memory_database_is_one_per_starting_directory(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = memory_db(env, tmp_path / "a")
    assert first == memory_db(env, tmp_path / "a")
    assert first != memory_db(env, tmp_path / "b")
    assert first.parent == tmp_path / "state" / "corral" / "memory"
    assert first.name.startswith("a-") and first.suffix == ".db"
    chosen = tmp_path / "mine.db"
    assert memory_db({**env, "CORRAL_MEMORY_SQLITE": str(chosen)}, tmp_path / "a") == chosen


def test_inside_sees_through_symlinks_and_paths_not_made_yet(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(workspace / "sub")
    assert is_inside(workspace / "not" / "yet", workspace)
    assert is_inside(tmp_path / "link" / "state", workspace)
    assert is_inside(workspace, workspace)
    assert not is_inside(tmp_path / "wsx", workspace)  # a prefix of the name is not inside
    assert not is_inside(tmp_path / "state", workspace)


def test_a_secret_is_0600_from_its_creation_and_replaces_a_wider_file(tmp_path: Path) -> None:
    target = tmp_path / "secrets" / "wire-token"
    target.parent.mkdir(mode=0o755)
    target.write_text("old")
    target.chmod(0o644)
    old_umask = os.umask(0)
    try:
        write_secret(target, "s3cret-value")
    finally:
        os.umask(old_umask)
    assert target.read_text() == "s3cret-value"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in target.parent.iterdir()) == ["wire-token"]  # no leftovers
    fresh = tmp_path / "new" / "deeper" / "model-key"
    write_secret(fresh, "k" * 20)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
