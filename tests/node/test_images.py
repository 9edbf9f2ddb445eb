"""Corral's images, built here from the debootstrap base: numeric non-root user, entrypoints
that exist in the image, and no test code in the sandbox image. Checked on the image's own
configuration (its OCI archive) and by running the image on the real node."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from corral_dev import realnode
from corral_dev.controlplane import ControlPlane

from . import _pods

pytestmark = pytest.mark.timeout(240)


def image_config(archive: Path) -> dict[str, Any]:
    """The `config` of the one image in an OCI archive (index -> manifest -> config)."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            algo, _, hexa = digest.partition(":")
            member = tar.extractfile(f"blobs/{algo}/{hexa}")
            assert member is not None
            data: dict[str, Any] = json.load(member)
            return data

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
        manifest = blob(index["manifests"][0]["digest"])
        config: dict[str, Any] = blob(manifest["config"]["digest"])["config"]
        return config


@pytest.mark.parametrize(
    ("key", "entrypoint"),
    [("OPERATOR", ["corral-operator"]), ("SANDBOX", ["corral-harness"])],
)
def test_image_runs_as_numeric_non_root_with_its_entrypoint(
    node_artifacts: realnode.Artifacts, key: str, entrypoint: list[str]
) -> None:
    config = image_config(Path(node_artifacts[f"{key}_OCI"]))
    user = config.get("User", "")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"user {user!r} is not a numeric non-root uid"
    assert not gid or gid.isdigit(), f"group of {user!r} is not numeric"
    assert config.get("Entrypoint") == entrypoint


CHECK = r"""
set -eu
echo "uid=$(id -u)"
for cmd in {commands}; do
  path=$(command -v "$cmd") || {{ echo "missing $cmd"; exit 1; }}
  test -x "$path" && echo "found $cmd"
done
exec python - <<'PY'
import importlib.util, os, sysconfig
site = sysconfig.get_paths()["purelib"]
bad = [m for m in ("pytest", "tests", "hypothesis") if importlib.util.find_spec(m)]
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    rel = os.path.relpath(root, site)
    third_party = not rel.startswith("..") and not rel.startswith("corral") and rel != "."
    if third_party or root.startswith("/usr/"):
        continue
    if os.path.basename(root) == "tests":
        bad.append(root)
    bad += [os.path.join(root, f) for f in files if f.startswith("test_") and f.endswith(".py")]
print("test code: " + " ".join(bad) if bad else "clean")
PY
"""


@pytest.mark.parametrize(
    ("key", "commands"),
    [
        ("OPERATOR", ["corral-operator"]),
        ("SANDBOX", ["corral-harness", "corral-custodian", "corral-exec", "git", "rg"]),
    ],
)
def test_image_on_the_real_node(
    node_plane: ControlPlane,
    real_node: realnode.RealNode,
    node_namespace: str,
    key: str,
    commands: list[str],
) -> None:
    """Run as the image's own user (no runAsUser), read-only root filesystem: the entrypoints
    are there, and neither pytest nor any tests/ directory of the project is."""
    image = real_node.artifacts[f"{key}_IMAGE"]
    security = {k: v for k, v in _pods.RESTRICTED.items() if k not in ("runAsUser", "runAsGroup")}
    security["readOnlyRootFilesystem"] = True
    name = key.lower()
    manifest = _pods.pod(
        name,
        node_namespace,
        image,
        ["sh", "-c"],
        args=[CHECK.format(commands=" ".join(commands))],
        security=security,
    )
    phase, logs = _pods.run_to_end(node_plane, manifest)
    assert phase == "Succeeded", logs
    assert "uid=10001" in logs
    for cmd in commands:
        assert f"found {cmd}" in logs
    assert logs.strip().endswith("clean"), logs
