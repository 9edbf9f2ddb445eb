"""`corral[cli]` alone is enough for everything but `corral run` (docs/ci.md installs the CI
gate so): every command's help, `corral evidence check` and the kubectl-style commands run in
a Python where every distribution outside that extra's requirements (read from pyproject.toml,
then each requirement's own metadata) fails to import as an uninstalled one does; `corral run`
there names the extra it lacks."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from corral_cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[3]
SESSION = ROOT / "examples" / "session.yaml"
CORRAL = "import sys; from corral_cli.main import main; sys.exit(main())"

HIDE = """
import sys

HIDDEN = frozenset({hidden!r})


class _Uninstalled:
    \"\"\"Distributions outside `corral[cli]`: imported, they fail as uninstalled ones do.\"\"\"

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None


sys.meta_path.insert(0, _Uninstalled())
"""


def _requirements(extra: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"],
                                     *project["optional-dependencies"][extra]]]  # fmt: skip


def _closure(extra: str) -> set[str]:
    """The distributions `pip install 'corral[EXTRA]'` brings: the project's own lists, then
    each requirement's installed metadata, its markers evaluated for the extras asked of it."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(r.name, frozenset(r.extras)) for r in _requirements(extra)]
    own = {"corral"}
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        if key[0] == "corral":
            todo += [(r.name, frozenset(r.extras)) for e in extras for r in _requirements(e)]
            continue
        for text in metadata.distribution(name).requires or []:
            req = Requirement(text)
            wanted = extras or {""}
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return own | {name for name, _ in seen}


@pytest.fixture(scope="module")
def cli_only(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    allowed = _closure("cli")
    assert "anthropic" not in allowed and "kopf" not in allowed  # the sandbox's, the operator's
    hidden = sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in allowed for d in dists)
    )
    assert {"anthropic", "kopf", "aiohttp"} <= set(hidden)
    site = tmp_path_factory.mktemp("cli-only")
    (site / "sitecustomize.py").write_text(HIDE.format(hidden=hidden))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "KUBECONFIG"))}
    return env | {"PYTHONPATH": str(site), "HOME": str(site), "PYTHONDONTWRITEBYTECODE": "1"}


def _corral(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CORRAL, *argv], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_the_hiding_works(cli_only: dict[str, str]) -> None:
    proof = subprocess.run([sys.executable, "-c", "import anthropic"], env=cli_only,
                           capture_output=True, text=True)  # fmt: skip
    assert proof.returncode == 1 and "ModuleNotFoundError" in proof.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_help_needs_only_the_cli_extra(
    cli_only: dict[str, str], command: str
) -> None:
    done = _corral(cli_only, command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "Traceback" not in done.stderr


def test_the_ci_gate_and_kubectl_commands_run_on_the_cli_extra(
    cli_only: dict[str, str], tmp_path: Path
) -> None:
    """No kubeconfig: each says so in its own words (exit 2), which takes importing all it
    would use against a cluster; a missing module would be named instead."""
    missing = str(tmp_path / "no-kubeconfig")
    for argv in (
        ["evidence", "check", "--repo", "r", "--revision", "a" * 40],
        ["get", "sessions"],
        ["describe", "session", "s"],
        ["logs", "s"],
        ["approve", "a1"],
        ["freeze", "namespace"],
    ):
        done = _corral(cli_only, *argv, "--kubeconfig", missing)
        assert done.returncode == 2, (argv, done.stderr)
        assert "kubeconfig" in done.stderr and "No module named" not in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_corral_run_on_the_cli_extra_names_the_sandbox_extra(
    cli_only: dict[str, str], tmp_path: Path
) -> None:
    done = _corral(cli_only, "run", "-f", str(SESSION), "--state-dir", str(tmp_path / "s"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'corral[sandbox]'" in done.stderr
