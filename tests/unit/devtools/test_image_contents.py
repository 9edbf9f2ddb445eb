"""The images' contents check without an image: the requirement closure from METADATA texts,
the strangers of a role, and the reading of a small OCI archive made here."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from corral_dev import image_contents as ic

ENV = ic.marker_environment("3.11.2", "x86_64")


def metadata(name: str, version: str = "1.0", *requires: str) -> str:
    lines = ["Metadata-Version: 2.3", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + "\n\nA long description, Requires-Dist: not-a-header\n"


CORRAL = metadata(
    "corral",
    "0.1.0",
    "pydantic<3,>=2.9",
    "kopf>=1.37; extra == 'operator'",
    "uvicorn[standard]>=0.30; extra == 'operator'",
    "anthropic>=0.40; extra == 'sandbox'",
    "opentelemetry-sdk; extra == 'tracing'",
    "corral[operator,sandbox]; extra == 'dev'",
)
INSTALLED = {
    "corral": CORRAL,
    "pydantic": metadata(
        "pydantic", "2.9", "typing-extensions>=4.6", "email-validator; extra == 'email'"
    ),
    "typing_extensions": metadata("typing_extensions", "4.12"),
    "kopf": metadata(
        "kopf", "1.37", "aiohttp", "uvloop; sys_platform != 'win32' and extra == 'uvloop'"
    ),
    "aiohttp": metadata("aiohttp", "3.10", "async-timeout; python_version < '3.11'"),
    "uvicorn": metadata(
        "uvicorn",
        "0.30",
        "h11",
        "httptools; extra == 'standard'",
        "colorama; sys_platform == 'win32' and extra == 'standard'",
        "uvloop; platform_machine == 'x86_64' and extra == 'standard'",
    ),
    "h11": metadata("h11"),
    "httptools": metadata("httptools"),
    "uvloop": metadata("uvloop"),
    "anthropic": metadata("anthropic", "2.0", "httpx2"),
    "httpx2": metadata("httpx2"),
}


def dists(names: list[str]) -> list[ic.Distribution]:
    return [ic.parse_metadata(INSTALLED[n]) for n in names]


def test_metadata_gives_the_canonical_name_and_the_requirements_not_the_body() -> None:
    dist = ic.parse_metadata(INSTALLED["typing_extensions"])
    assert (dist.name, dist.version, dist.requires) == ("typing-extensions", "4.12", ())
    assert ic.parse_metadata(CORRAL).requires[0] == "pydantic<3,>=2.9"
    with pytest.raises(ValueError, match="Name"):
        ic.parse_metadata("Metadata-Version: 2.3\nVersion: 1\n")


def test_the_closure_follows_the_extras_asked_and_the_markers_that_hold() -> None:
    closure = ic.requirement_closure(dists(list(INSTALLED)), "corral", ["operator"], ENV)
    # uvicorn[standard] brings httptools, and uvloop on x86_64; not colorama (win32), not
    # async-timeout (python < 3.11), not pydantic's `email` extra, not kopf's `uvloop` extra's.
    assert closure.reached == {
        "corral",
        "pydantic",
        "typing-extensions",
        "kopf",
        "aiohttp",
        "uvicorn",
        "h11",
        "httptools",
        "uvloop",
    }
    assert closure.missing == set()


def test_the_closure_evaluates_markers_for_the_image_not_this_machine() -> None:
    arm = ic.marker_environment("3.11.2", "aarch64")
    closure = ic.requirement_closure(dists(list(INSTALLED)), "corral", ["operator"], arm)
    assert "uvloop" not in closure.reached and "httptools" in closure.reached
    old = ic.marker_environment("3.10.12")
    with_timeout = [*dists(list(INSTALLED)), ic.parse_metadata(metadata("async-timeout"))]
    closure = ic.requirement_closure(with_timeout, "corral", ["operator"], old)
    assert "async-timeout" in closure.reached


def test_the_closure_of_several_extras_and_a_self_reference() -> None:
    everything = dists(list(INSTALLED))
    two = ic.requirement_closure(everything, "corral", ["sandbox", "operator"], ENV)
    dev = ic.requirement_closure(everything, "corral", ["dev"], ENV)
    assert two.reached == dev.reached
    assert {"anthropic", "httpx2", "kopf"} <= two.reached


def test_what_is_required_and_absent_is_missing() -> None:
    closure = ic.requirement_closure(dists(["corral", "pydantic"]), "corral", ["tracing"], ENV)
    assert closure.missing == {"typing-extensions", "opentelemetry-sdk"}
    assert ic.requirement_closure([], "corral", [], ENV).missing == {"corral"}


LAUNCHER = """#!/opt/corral/bin/python3
# -*- coding: utf-8 -*-
import re
import sys
from corral_operator.main import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def test_a_console_script_names_its_module_and_other_files_name_none() -> None:
    assert ic.console_script_module(LAUNCHER) == "corral_operator.main"
    assert ic.console_script_module("#!/bin/sh\nfrom x import y\n") is None
    assert ic.console_script_module("# activate\nfrom x import y\n") is None
    assert ic.console_script_module("#!/opt/corral/bin/python\nprint(1)\n") is None


def test_a_module_is_installed_as_a_file_a_package_or_an_extension() -> None:
    files = {"a.py", "b/__init__.py", "c/d.cpython-311-x86_64-linux-gnu.so", "ns/m/x.py"}
    assert all(ic.module_installed(m, files) for m in ("a", "b", "c.d", "ns.m", "ns"))
    assert not any(ic.module_installed(m, files) for m in ("aa", "b.e", "c.e", "ns.x"))


OPERATOR_DISTS = ["corral", "pydantic", "typing_extensions", "kopf", "aiohttp", "uvicorn", "h11"]
OPERATOR_DISTS += ["httptools", "uvloop"]


def operator_image(dist_names: list[str], packages: list[str]) -> tuple[set[str], dict[str, str]]:
    files: set[str] = set()
    meta: dict[str, str] = {}
    for name in [*dist_names, "pip", "setuptools"]:
        text = INSTALLED.get(name) or metadata(name, "23.0")
        directory = f"{name}-1.0.dist-info"
        files |= {f"{directory}/METADATA", f"{directory}/RECORD"}
        meta[directory] = text
        files.add(f"{name}/__init__.py")
    files |= {f"{p}/__init__.py" for p in packages}
    files.add("corral_operator/main.py")
    return files, meta


def test_an_image_of_its_role_alone_has_no_stranger() -> None:
    files, meta = operator_image(
        OPERATOR_DISTS, ["corral_api", "corral_common", "corral_kube", "corral_operator"]
    )
    scripts = {"corral-operator": LAUNCHER, "activate": "# source me\n", "python": ""}
    assert ic.strangers(ic.ROLES["operator"], files, meta, scripts, ENV) == []


def test_every_kind_of_stranger_is_named() -> None:
    files, meta = operator_image(
        [*OPERATOR_DISTS, "anthropic", "httpx2"],
        [
            "corral_api",
            "corral_common",
            "corral_kube",
            "corral_operator",
            "corral_harness",
            "corral_dev",
        ],
    )
    files |= {"corral_dev/scripted/__init__.py", "orphan-2.0.dist-info/RECORD"}
    harness_script = LAUNCHER.replace("corral_operator.main", "corral_cli.main")
    scripts = {"corral-operator": LAUNCHER, "corral": harness_script}
    problems = ic.strangers(ic.ROLES["operator"], files, meta, scripts, ENV)
    assert problems == [
        "orphan-2.0.dist-info has no METADATA",
        "distribution anthropic 2.0 is not in the closure of corral[operator]",
        "distribution httpx2 1.0 is not in the closure of corral[operator]",
        "Corral package corral_dev is not the operator image's",
        "Corral package corral_harness is not the operator image's",
        "the scripted model server is installed: corral_dev/scripted/__init__.py",
        "console script corral runs corral_cli.main, which is not installed",
    ]


def test_a_lacking_package_or_requirement_is_named_too() -> None:
    files, meta = operator_image(
        [n for n in OPERATOR_DISTS if n != "h11"], ["corral_api", "corral_operator"]
    )
    problems = ic.strangers(ic.ROLES["operator"], files, meta, {}, ENV)
    assert problems == [
        "corral[operator] requires h11, which is not installed",
        "Corral package corral_common is missing",
        "Corral package corral_kube is missing",  # the operator's Kubernetes client (ADR 0101)
    ]


# ----------------------------------------------------------------- a small OCI archive

SITE = "opt/corral/lib/python3.11/site-packages"


def layer(entries: dict[str, bytes | None], *, compress: bool) -> bytes:
    """A layer tar: a None value is a directory."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue()) if compress else raw.getvalue()


def oci_archive(path: Path, layers: list[bytes], architecture: str) -> Path:
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": f"sha256:{digest}", "size": len(data)}

    config = add(json.dumps({"architecture": architecture, "config": {}}).encode())
    manifest = {"config": config, "layers": [add(data) for data in layers]}
    index = {"manifests": [add(json.dumps(manifest).encode())]}
    with tarfile.open(path, "w") as tar:
        for name, data in [("index.json", json.dumps(index).encode())] + [
            (f"blobs/sha256/{d}", b) for d, b in blobs.items()
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_an_oci_archive_is_read_layer_over_layer(tmp_path: Path) -> None:
    base = layer(
        {
            "./usr/": None,
            "./usr/bin/python3": b"\x7fELF",
            "./etc/old/a": b"a",
            "./etc/old/b": b"b",
            "./etc/gone": b"x",
        },
        compress=True,
    )
    corral_meta = metadata("corral", "0.1.0", "pydantic; extra == 'operator'").encode()
    venv = layer(
        {
            "opt/corral/pyvenv.cfg": b"home = /usr/bin\nversion = 3.11.9\n",
            "opt/corral/bin/corral-operator": LAUNCHER.encode(),
            "opt/corral/bin/corral": LAUNCHER.replace("corral_operator", "corral_cli").encode(),
            f"{SITE}/corral-0.1.0.dist-info/METADATA": corral_meta,
            f"{SITE}/pydantic-2.9.dist-info/METADATA": INSTALLED["pydantic"].encode(),
            f"{SITE}/typing_extensions-4.12.dist-info/METADATA": b"Name: typing_extensions\n",
            f"{SITE}/corral_api/__init__.py": b"",
            f"{SITE}/corral_common/__init__.py": b"",
            f"{SITE}/corral_kube/__init__.py": b"",
            f"{SITE}/corral_operator/main.py": b"",
            f"{SITE}/corral_harness/scripted/__init__.py": b"",
            "etc/.wh.gone": b"",
            "etc/old/.wh..wh..opq": b"",
            "etc/old/c": b"c",
        },
        compress=False,
    )
    archive = oci_archive(tmp_path / "image.oci.tar", [base, venv], "arm64")
    image = ic.read_image(archive)
    assert {"usr/bin/python3", "etc/old/c"} <= image.files
    assert not {"etc/gone", "etc/old/a", "etc/old/b", "usr"} & image.files
    assert image.site_packages() == (f"{SITE}/", "3.11")
    assert (image.python_full_version(), image.machine()) == ("3.11.9", "aarch64")
    assert f"{SITE}/corral_operator/main.py" not in image.contents  # only what the check reads
    assert ic.image_strangers(image, ic.ROLES["operator"]) == [
        "Corral package corral_harness is not the operator image's",
        "the scripted model server is installed: corral_harness/scripted/__init__.py",
        "console script corral runs corral_cli.main, which is not installed",
    ]


def test_a_layer_that_is_no_tar_is_named(tmp_path: Path) -> None:
    archive = oci_archive(tmp_path / "bad.oci.tar", [b"\x28\xb5\x2f\xfd not a tar"], "amd64")
    with pytest.raises(ValueError, match="layer"):
        ic.read_image(archive)
