"""What an image's Python environment may hold, checked on its OCI archive: the requirement
closure of its role's extras (read from the METADATA files inside the image) and the strangers
outside it (tests/node/test_image_contents.py; the pure parts in tests/unit/devtools)."""

from __future__ import annotations

import json
import posixpath
import re
import tarfile
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import IO, Any

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PREFIX = "opt/corral"  # the venv every image installs into (its Dockerfile)
SITE_PACKAGES = re.compile(rf"^{PREFIX}/lib/python(3\.\d+)/site-packages/")
BIN = f"{PREFIX}/bin/"
# Seeded by `python -m venv` before the install: the venv's own installer, in no closure.
VENV_SEED = frozenset({"pip", "setuptools"})
_SCRIPT_MODULE = re.compile(r"^from\s+([\w.]+)\s+import\s", re.M)
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "386": "i686"}


@dataclass(frozen=True)
class Role:
    """An image's role: the extras its Dockerfile installs, and the Corral packages it holds."""

    name: str
    extras: tuple[str, ...]
    packages: frozenset[str]


# As the Dockerfiles install them: `.[operator]` (operator/Dockerfile) and
# `.[sandbox,tracing]` (harness_image/Dockerfile). Both hold the Kubernetes client: the
# operator and the custodian reach the API server through it (ADR 0101).
ROLES = {
    "operator": Role(
        "operator",
        ("operator",),
        frozenset({"corral_api", "corral_common", "corral_kube", "corral_operator"}),
    ),
    "sandbox": Role(
        "sandbox",
        ("sandbox", "tracing"),
        frozenset(
            {"corral_api", "corral_common", "corral_kube", "corral_harness", "corral_custodian"}
        ),
    ),
}


# ------------------------------------------------------------------ pure: the closure


@dataclass(frozen=True)
class Distribution:
    name: str  # canonical (PEP 503)
    version: str
    requires: tuple[str, ...]  # Requires-Dist, markers included


def parse_metadata(text: str) -> Distribution:
    """A distribution's name, version and Requires-Dist from its METADATA text."""
    message = Parser().parsestr(text, headersonly=True)
    name = message.get("Name")
    if not name:
        raise ValueError("METADATA without a Name")
    return Distribution(
        canonicalize_name(name),
        message.get("Version", ""),
        tuple(message.get_all("Requires-Dist") or ()),
    )


def marker_environment(python_full_version: str, machine: str = "x86_64") -> dict[str, str]:
    """The environment markers of a CPython on Linux, as an image's interpreter sees them."""
    major_minor = ".".join(python_full_version.split(".")[:2])
    return {
        "implementation_name": "cpython",
        "implementation_version": python_full_version,
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": python_full_version,
        "python_version": major_minor,
        "sys_platform": "linux",
    }


@dataclass(frozen=True)
class Closure:
    reached: frozenset[str]  # installed distributions the root's requirements reach (and it)
    missing: frozenset[str]  # required and not installed


def _applies(marker: Marker | None, extras: Iterable[str], env: Mapping[str, str]) -> bool:
    """Whether a requirement holds for `env` with one of `extras` ("" for none) asked."""
    if marker is None:
        return True
    return any(marker.evaluate({**env, "extra": extra}) for extra in extras)


def requirement_closure(
    installed: Iterable[Distribution],
    root: str,
    extras: Iterable[str],
    env: Mapping[str, str],
) -> Closure:
    """The distributions `root[extras]` needs, transitively, among `installed`: each
    Requires-Dist whose marker holds for `env` and one of the extras asked of its holder."""
    by_name = {dist.name: dist for dist in installed}
    done: dict[str, set[str]] = {}  # distribution -> extras already followed ("" the base)
    missing: set[str] = set()
    queue: list[tuple[str, frozenset[str]]] = [
        (canonicalize_name(root), frozenset(canonicalize_name(e) for e in extras))
    ]
    while queue:
        name, wanted = queue.pop()
        dist = by_name.get(name)
        if dist is None:
            missing.add(name)
            continue
        new = ({""} | wanted) - done.setdefault(name, set())
        if not new:
            continue
        done[name] |= new
        for line in dist.requires:
            requirement = Requirement(line)
            if _applies(requirement.marker, new, env):
                queue.append(
                    (
                        canonicalize_name(requirement.name),
                        frozenset(canonicalize_name(e) for e in requirement.extras),
                    )
                )
    return Closure(frozenset(done), frozenset(missing))


# ------------------------------------------------------------ pure: the strangers


def console_script_module(text: str) -> str | None:
    """The module a pip console-script launcher imports its entry point from; None for any
    other file (a shell script, a binary, an activate script)."""
    first, _, rest = text.partition("\n")
    if not first.startswith("#!") or "python" not in first:
        return None
    found = _SCRIPT_MODULE.search(rest)
    return found.group(1) if found else None


def module_installed(module: str, site_files: Collection[str]) -> bool:
    """Whether `module` (dotted) is importable from a site-packages holding `site_files`
    (paths relative to it): a .py file, a package directory or an extension module."""
    path = module.replace(".", "/")
    return any(f == f"{path}.py" or f.startswith((f"{path}/", f"{path}.")) for f in site_files)


def _top_level(site_files: Iterable[str]) -> set[str]:
    return {f.split("/", 1)[0] for f in site_files}


def _is_scripted_server(path: str) -> bool:
    parts = path.split("/")
    return parts[0].startswith("corral") and any(
        part in ("scripted", "scripted.py") or part.startswith("scripted.") for part in parts[1:]
    )


def strangers(
    role: Role,
    site_files: Collection[str],
    metadata: Mapping[str, str],
    scripts: Mapping[str, str],
    env: Mapping[str, str],
) -> list[str]:
    """What the image of `role` holds that it should not, and what it lacks, one line each.

    `site_files`: every file in site-packages (relative paths); `metadata`: each
    `*.dist-info` directory's METADATA text; `scripts`: the venv's bin/ files as text.
    """
    problems: list[str] = []
    installed: list[Distribution] = []
    for directory in sorted(d for d in _top_level(site_files) if d.endswith(".dist-info")):
        if directory not in metadata:
            problems.append(f"{directory} has no METADATA")
            continue
        installed.append(parse_metadata(metadata[directory]))
    closure = requirement_closure(installed, "corral", role.extras, env)
    asked = f"corral[{','.join(role.extras)}]"
    allowed = closure.reached | VENV_SEED
    problems += [
        f"distribution {dist.name} {dist.version} is not in the closure of {asked}"
        for dist in installed
        if dist.name not in allowed
    ]
    problems += [f"{asked} requires {name}, which is not installed" for name in closure.missing]
    tops = _top_level(site_files)
    problems += [
        f"Corral package {name} is not the {role.name} image's"
        for name in sorted(tops)
        if name.startswith("corral_") and name not in role.packages
    ]
    problems += [f"Corral package {name} is missing" for name in sorted(role.packages - tops)]
    scripted = sorted(f for f in site_files if _is_scripted_server(f))
    if scripted:
        problems.append(f"the scripted model server is installed: {scripted[0]}")
    for script, text in sorted(scripts.items()):
        module = console_script_module(text)
        if module and not module_installed(module, site_files):
            problems.append(f"console script {script} runs {module}, which is not installed")
    return problems


# ------------------------------------------------------------------ the OCI archive


@dataclass
class ImageFiles:
    """An image's files, its layers applied in order (whiteouts honoured), with the text of
    the few files the check reads."""

    files: set[str] = field(default_factory=set)
    contents: dict[str, bytes] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def site_packages(self) -> tuple[str, str]:
        """(its path, the Python version of its directory name)."""
        for path in sorted(self.files):
            found = SITE_PACKAGES.match(path)
            if found:
                return found.group(0), found.group(1)
        raise ValueError(f"no {PREFIX}/lib/python3.*/site-packages in the image")

    def python_full_version(self) -> str:
        """The venv's interpreter version (pyvenv.cfg), else its site-packages' X.Y."""
        cfg = self.contents.get(f"{PREFIX}/pyvenv.cfg", b"").decode(errors="replace")
        found = re.search(r"^version(?:_info)?\s*=\s*(\d+\.\d+(?:\.\d+)?)", cfg, re.M)
        return found.group(1) if found else self.site_packages()[1]

    def machine(self) -> str:
        arch = str(self.config.get("architecture", "amd64"))
        return _MACHINES.get(arch, arch)


def _wanted(path: str, size: int) -> bool:
    if path == f"{PREFIX}/pyvenv.cfg":
        return True
    if path.startswith(BIN):
        return size <= 64 * 1024  # launchers, not binaries such as corral-exec
    return bool(SITE_PACKAGES.match(path)) and path.endswith(".dist-info/METADATA")


def _normal(name: str) -> str:
    return (name[2:] if name.startswith("./") else name).lstrip("/").rstrip("/")


def _apply_layer(image: ImageFiles, layer: IO[bytes]) -> None:
    added: dict[str, bytes | None] = {}
    removed: list[str] = []
    with tarfile.open(fileobj=layer, mode="r|*") as tar:
        for member in tar:
            path = _normal(member.name)
            parent, base = posixpath.split(path)
            if base == ".wh..wh..opq":
                removed.append(f"{parent}/" if parent else "")
            elif base.startswith(".wh."):
                removed.append(posixpath.join(parent, base[4:]))
            elif not member.isdir():
                data = None
                if member.isfile() and _wanted(path, member.size):
                    handle = tar.extractfile(member)
                    data = handle.read() if handle else None
                added[path] = data
    for gone in removed:
        if gone.endswith("/") or gone == "":
            doomed = {f for f in image.files if f.startswith(gone)}
        else:
            doomed = {f for f in image.files if f == gone or f.startswith(f"{gone}/")}
        image.files -= doomed
        for f in doomed:
            image.contents.pop(f, None)
    for path, data in added.items():
        image.files.add(path)
        if data is None:
            image.contents.pop(path, None)
        else:
            image.contents[path] = data


def read_image(archive: Path) -> ImageFiles:
    """The files of the one image in an OCI archive (index.json -> manifest -> layers, each a
    tar, plain or compressed)."""
    image = ImageFiles()
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> IO[bytes]:
            algo, _, hexa = digest.partition(":")
            member = outer.extractfile(f"blobs/{algo}/{hexa}")
            if member is None:
                raise ValueError(f"{archive}: no blob {digest}")
            return member

        index_file = outer.extractfile("index.json")
        if index_file is None:
            raise ValueError(f"{archive}: no index.json")
        manifest: dict[str, Any] = json.load(index_file)
        while "layers" not in manifest:  # an index (of indexes) names its manifests
            manifest = json.load(blob(manifest["manifests"][0]["digest"]))
        image.config = json.load(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            try:
                _apply_layer(image, blob(layer["digest"]))
            except tarfile.ReadError as e:
                raise ValueError(f"{archive}: layer {layer.get('mediaType')}: {e}") from e
    return image


def image_strangers(image: ImageFiles, role: Role) -> list[str]:
    """`strangers` for the files of an image read from its archive."""
    site, _ = image.site_packages()
    site_files = {f[len(site) :] for f in image.files if f.startswith(site)}
    metadata = {
        f[len(site) :].split("/", 1)[0]: data.decode(errors="replace")
        for f, data in image.contents.items()
        if f.startswith(site) and f.endswith(".dist-info/METADATA")
    }
    scripts = {
        f[len(BIN) :]: data.decode(errors="replace")
        for f, data in image.contents.items()
        if f.startswith(BIN) and "/" not in f[len(BIN) :]
    }
    env = marker_environment(image.python_full_version(), image.machine())
    return strangers(role, site_files, metadata, scripts, env)
