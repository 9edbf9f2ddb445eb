"""A kind's next version on the real API server: the path docs/api-versions.md documents.

`next_version_crd` renders a kind serving v1alpha1 and v1alpha2 with conversion `None`. These
tests install it and pin what kube-apiserver and etcd do with it: an object written through one
version reads through the other, the storage version is what etcd holds and what
`status.storedVersions` lists, an added field survives the writes the document says it survives
(and is lost to the ones it says lose it), the printer columns print through both versions, and
the old version is dropped only after a storage migration.

Why a copy of Session under a group of its own, not the Session CRD itself: the control plane is
the tier's, shared by every test in this process, with Corral's CRDs installed once for all of
them (conftest.py). Replacing the Session CRD would move the storage version under the other
tests' Sessions and operators, and it could not simply be put back: the API server keeps a
version in `status.storedVersions` until a migration has rewritten every object. So each test
installs `next_version_crd(Session)` renamed to NextSession in a group named after its
namespace, without short names, categories or the part-of label (nothing that looks up or
lists Corral's kinds finds it), and deletes it after. The schema, columns and status
subresource are Session's, unchanged. The operator does not run here: it watches corral.dev
only; what the path depends on is the API server's behaviour, and that is what is pinned.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral_api import crdgen
from corral_api.kinds import Session
from corral_dev.controlplane import ControlPlane

from ._operator_fixtures import session_doc, wait_for

pytestmark = pytest.mark.timeout(120)

KIND = "NextSession"
PLURAL = "nextsessions"
V1, V2 = "v1alpha1", crdgen.NEXT_VERSION
PRIORITY = {"type": "integer", "minimum": 0, "description": "Higher runs first."}
ADDED = {"spec": {"priority": PRIORITY}}
MERGE = "application/merge-patch+json"


def _renamed(crd: dict[str, Any], group: str) -> dict[str, Any]:
    """`crd` as the test's own kind in `group`; its versions, schema and columns unchanged."""
    crd = copy.deepcopy(crd)
    crd["metadata"] = {"name": f"{PLURAL}.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"] = {
        "kind": KIND,
        "listKind": f"{KIND}List",
        "plural": PLURAL,
        "singular": KIND.lower(),
    }
    return crd


def _next_only(crd: dict[str, Any]) -> dict[str, Any]:
    """The added field in v1alpha2's schema only: what the documented path never renders."""
    crd = copy.deepcopy(crd)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == V1]
    del v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["priority"]
    return crd


@dataclass
class NextKind:
    """The test's copy of Session, read and written through either version."""

    plane: ControlPlane
    group: str
    namespace: str

    @property
    def crd_name(self) -> str:
        return f"{PLURAL}.{self.group}"

    def install(self, crd: dict[str, Any]) -> None:
        """Apply `crd` (rendered for Session) and wait until the API server serves it and
        writes in its storage version: discovery then publishes that version's hash."""
        self.plane.apply_object(_renamed(crd, self.group))
        (storage,) = [v["name"] for v in crd["spec"]["versions"] if v["storage"]]
        wanted = self.storage_hash(storage)
        wait_for(f"{self.crd_name} stored as {storage}", lambda: self.served_hash() == wanted)

    def storage_hash(self, version: str) -> str:
        """The hash discovery publishes for objects stored in `version` (as the API server
        computes it: the first 8 bytes of sha256("group/version/kind"))."""
        digest = hashlib.sha256(f"{self.group}/{version}/{KIND}".encode()).digest()
        return base64.b64encode(digest[:8]).decode()

    def served_hash(self) -> str:
        """The storage version's hash in discovery (what a storage migrator watches)."""
        for version in (V2, V1):
            found = self.plane.api_get(f"/apis/{self.group}/{version}") or {}
            for resource in found.get("resources", []):
                if resource.get("storageVersionHash"):
                    return str(resource["storageVersionHash"])
        return ""

    def crd(self) -> dict[str, Any]:
        found = self.plane.api_get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{self.crd_name}"
        )
        assert found is not None
        return found

    def served_versions(self) -> list[str]:
        """The versions discovery lists for the group, the preferred one first."""
        group = self.plane.api_get(f"/apis/{self.group}") or {}
        return [v["version"] for v in group.get("versions", [])]

    def url(self, version: str, name: str = "") -> str:
        base = f"/apis/{self.group}/{version}/namespaces/{self.namespace}/{PLURAL}"
        return f"{base}/{name}" if name else base

    def create(self, version: str, name: str, **spec: Any) -> dict[str, Any]:
        doc = session_doc(name, Path("/srv/git/repo"), **spec)
        doc["apiVersion"], doc["kind"] = f"{self.group}/{version}", KIND
        created = self.plane.api_send("POST", self.url(version), doc)
        assert created is not None
        return created

    def read(self, version: str, name: str) -> dict[str, Any]:
        found = self.plane.api_get(self.url(version, name))
        assert found is not None, f"{name} through {version}"
        return found

    def spec(self, version: str, name: str) -> dict[str, Any]:
        return dict(self.read(version, name)["spec"])

    def merge_patch(self, version: str, name: str, patch: dict[str, Any], sub: str = "") -> None:
        url = self.url(version, name) + (f"/{sub}" if sub else "")
        self.plane.api_send("PATCH", url, patch, MERGE)

    def stored_as(self, name: str) -> str:
        """The apiVersion etcd holds the object at: the storage version it was last written in.
        Read from etcd itself (its JSON gateway): every API read converts to the version asked."""
        args = [str(a) for a in self.plane.processes["etcd"].args]
        etcd = args[args.index("--listen-client-urls") + 1]
        key = f"/registry/{self.group}/{PLURAL}/{self.namespace}/{name}"
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        request = urllib.request.Request(f"{etcd}/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            (kv,) = json.loads(answer.read())["kvs"]
        return str(json.loads(base64.b64decode(kv["value"]))["apiVersion"])


@pytest.fixture
def next_kind(control_plane: ControlPlane, namespace: str) -> Iterator[NextKind]:
    kind = NextKind(control_plane, f"{namespace}.corral-next.test", namespace)
    yield kind
    control_plane.kubectl("delete", "crd", kind.crd_name, "--ignore-not-found", "--wait=false")


def test_an_object_reads_through_either_version_and_is_stored_as_v1alpha1(
    next_kind: NextKind, control_plane: ControlPlane
) -> None:
    next_kind.install(crdgen.next_version_crd(Session, ADDED))
    # Both versions served, v1alpha1 the only one ever stored; kubectl's default is the
    # preferred version, the newest.
    wait_for("both versions in discovery", lambda: next_kind.served_versions() == [V2, V1])
    group = control_plane.api_get(f"/apis/{next_kind.group}")
    assert group is not None and group["preferredVersion"]["version"] == V2
    assert next_kind.crd()["status"]["storedVersions"] == [V1]

    # Written through v1alpha1, read through v1alpha2 by kubectl: the same object, relabelled.
    one = next_kind.create(V1, "one", priority=3)
    raw = control_plane.kubectl("get", "--raw", next_kind.url(V2, "one")).stdout
    through_v2 = json.loads(raw)
    assert through_v2["apiVersion"] == f"{next_kind.group}/{V2}"
    assert through_v2["metadata"]["uid"] == one["metadata"]["uid"]
    assert through_v2["spec"] == one["spec"] and one["spec"]["priority"] == 3

    # And the other way round.
    two = next_kind.create(V2, "two", priority=5)
    through_v1 = next_kind.read(V1, "two")
    assert through_v1["apiVersion"] == f"{next_kind.group}/{V1}"
    assert through_v1["spec"] == two["spec"] and two["spec"]["priority"] == 5

    # Whatever version it came through, etcd holds the storage version.
    assert next_kind.stored_as("one") == next_kind.stored_as("two") == f"{next_kind.group}/{V1}"
    # A list through either version returns both objects.
    for version in (V1, V2):
        listed = control_plane.api_get(next_kind.url(version)) or {}
        assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["one", "two"]


def test_the_printer_columns_print_through_both_versions(
    next_kind: NextKind, control_plane: ControlPlane
) -> None:
    next_kind.install(crdgen.next_version_crd(Session, ADDED))
    next_kind.create(V1, "one")
    next_kind.create(V2, "two")
    status = {"phase": "Running", "turns": 2, "podName": "corral-one", "usage": {"cost": 0.25}}
    next_kind.merge_patch(V1, "one", {"status": status}, sub="status")
    next_kind.merge_patch(V2, "two", {"status": {**status, "phase": "Succeeded"}}, sub="status")

    printed = {}
    for version in (V1, V2):
        for wide in ((), ("-o", "wide")):
            out = control_plane.kubectl(
                "get", f"{PLURAL}.{version}.{next_kind.group}", "-n", next_kind.namespace, *wide
            ).stdout
            # AGE, the last column, may tick between the two calls.
            printed[version, bool(wide)] = [line.rsplit(None, 1)[0] for line in out.splitlines()]
    assert printed[V1, False] == printed[V2, False]
    assert printed[V1, True] == printed[V2, True]
    header, one, two = printed[V2, False]
    assert header.split() == ["NAME", "AGENT", "PHASE", "TURNS", "RESTARTS", "OUTCOME", "FROZEN",
                              "WAKES"]  # fmt: skip
    assert one.split() == ["one", "coder", "Running", "2", "0"]
    assert two.split() == ["two", "coder", "Succeeded", "2", "0"]
    header, one, _ = printed[V2, True]
    assert header.split()[5:9] == ["OUTCOME", "POD", "COST", "REVISION"]
    assert one.split() == ["one", "coder", "Running", "2", "0", "corral-one", "0.25"]


def test_a_field_only_the_next_version_knows_is_lost_to_writes(next_kind: NextKind) -> None:
    """Why the documented path adds a field to v1alpha1's schema too: with `None` the API
    server prunes each version's view to that version's schema."""
    next_kind.install(_next_only(crdgen.next_version_crd(Session, ADDED)))
    # Stored as v1alpha1, the field is pruned on the way to etcd, even written through
    # v1alpha2: the create succeeds, and its own answer has lost the field.
    assert "priority" not in next_kind.create(V2, "early", priority=5)["spec"]
    assert "priority" not in next_kind.spec(V2, "early")

    # Stored as v1alpha2, it is kept, but v1alpha1 clients do not see it, and any write of
    # theirs erases it: a merge patch of another field is applied to their view.
    next_kind.install(_next_only(crdgen.next_version_crd(Session, ADDED, storage=V2)))
    next_kind.create(V2, "late", priority=5)
    assert next_kind.spec(V2, "late")["priority"] == 5
    assert "priority" not in next_kind.spec(V1, "late")
    next_kind.merge_patch(V1, "late", {"spec": {"task": "Another task."}})
    assert next_kind.spec(V2, "late")["task"] == "Another task."
    assert "priority" not in next_kind.spec(V2, "late")


def test_the_storage_version_moves_the_objects_migrate_and_v1alpha1_is_dropped(
    next_kind: NextKind, control_plane: ControlPlane
) -> None:
    # Release N: the field in both schemas, v1alpha1 stored.
    next_kind.install(crdgen.next_version_crd(Session, ADDED))
    names = ("one", "two", "three", "untouched")
    for name, version in zip(names, (V1, V2, V1, V2), strict=True):
        next_kind.create(version, name, priority=3)
    assert next_kind.served_hash() == next_kind.storage_hash(V1)

    # Release N+1: v1alpha2 stored. The CRD's status records it at once; discovery's hash
    # moves (install waits for it); objects already in etcd stay as they were written.
    moved = crdgen.next_version_crd(Session, ADDED, storage=V2)
    next_kind.install(moved)
    assert next_kind.crd()["status"]["storedVersions"] == [V1, V2]
    assert next_kind.spec(V1, "untouched")["priority"] == 3
    assert next_kind.stored_as("untouched") == f"{next_kind.group}/{V1}"

    # v1alpha1 clients keep working and keep the field: a merge patch of another field, a
    # full PUT of the object as they read it (v1alpha1 knows priority, so it is sent back) and
    # a server-side apply.
    next_kind.merge_patch(V1, "one", {"spec": {"task": "Patched through v1alpha1."}})
    read = next_kind.read(V1, "two")
    read["spec"]["task"] = "Replaced through v1alpha1."
    control_plane.api_send("PUT", next_kind.url(V1, "two"), read)
    # Server-side apply through v1alpha1, by another manager, touches only what it names.
    applied = control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=another-client",
        "-n", next_kind.namespace, "-f", "-", input=json.dumps({
            "apiVersion": f"{next_kind.group}/{V1}", "kind": KIND, "metadata": {"name": "one"},
            "spec": {"keepSandbox": True},
        }), check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    assert next_kind.spec(V2, "one")["keepSandbox"] is True
    for name, task in (("one", "Patched"), ("two", "Replaced")):
        spec = next_kind.spec(V2, name)
        assert spec["task"].startswith(task) and spec["priority"] == 3, spec
    # A PUT replaces the object: a client that leaves the field out (one built before it
    # existed) removes it, through either version, as with any field added in place.
    stale = next_kind.read(V1, "three")
    del stale["spec"]["priority"]
    control_plane.api_send("PUT", next_kind.url(V1, "three"), stale)
    assert "priority" not in next_kind.spec(V2, "three")

    # v1alpha1 cannot leave the CRD while objects may still be stored in it.
    only_v2 = copy.deepcopy(moved)
    only_v2["spec"]["versions"] = [v for v in only_v2["spec"]["versions"] if v["name"] == V2]
    refused = control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-",
        input=json.dumps(_renamed(only_v2, next_kind.group)), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "must remain in spec.versions until a storage migration" in refused.stderr

    # The migration: an empty patch of every object (docs/api-versions.md's command) stores
    # it in v1alpha2: the API server writes it, since its stored bytes change ...
    listed = control_plane.api_get(next_kind.url(V2)) or {}
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == sorted(names)
    resource = f"{PLURAL}.{next_kind.group}"
    for item in listed["items"]:
        control_plane.kubectl(
            "patch", resource, item["metadata"]["name"], "-n", next_kind.namespace,
            "--type=merge", "-p", "{}",
        )  # fmt: skip
    for name in names:
        assert next_kind.stored_as(name) == f"{next_kind.group}/{V2}", name
    # ... then v1alpha1 leaves status.storedVersions,
    control_plane.kubectl(
        "patch", "crd", next_kind.crd_name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"storedVersions": [V2]}}),
    )  # fmt: skip
    # is no longer served (the step that can be undone) ...
    retired = copy.deepcopy(moved)
    retired["spec"]["versions"][0]["served"] = False
    next_kind.install(retired)
    wait_for("discovery without v1alpha1", lambda: next_kind.served_versions() == [V2])
    assert control_plane.api_get(next_kind.url(V1, "one")) is None
    # ... and leaves the CRD. The objects read as they were.
    next_kind.install(only_v2)
    assert [v["name"] for v in next_kind.crd()["spec"]["versions"]] == [V2]
    assert next_kind.crd()["status"]["storedVersions"] == [V2]
    assert next_kind.spec(V2, "untouched")["priority"] == 3
    assert next_kind.spec(V2, "one")["task"] == "Patched through v1alpha1."
