"""The node tier: real containers on a real kubelet, containerd and runc, with kube-proxy,
CoreDNS and an iptables NetworkPolicy enforcer, against the local control plane.

One control plane and one real node serve the whole run (`real_node`, session-scoped). The
node needs root and a Linux kernel with network namespaces and br_netfilter; its binaries and
images are built by hack/node/ once, after collection and before the first test (a cold
build is not charged to a test's timeout), and cached under ~/.cache/corral.

When the node cannot be built or started, the tier FAILS if CORRAL_REQUIRE_NODE=1 (CI), and
otherwise is skipped with the reason (a person's machine without root).

Corral's own tests of the tier (test_corral_on_node.py) take their cluster from the `target`
fixture: the real node, or, with CORRAL_E2E_KUBECONFIG set (hack/e2e-kind.sh), another
cluster of real containers (see _target.py); the real node's own tests are skipped then.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn
from unittest import mock

import pytest

from corral_dev import controlplane, earlier, realnode

from ..conftest import record_tier_time
from . import _target
from ._host import host_iptables_rules

REQUIRE = os.environ.get("CORRAL_REQUIRE_NODE", "") not in ("", "0")
_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "node: needs the real node (root; built on first use)")


def _timed(what: str, seconds: float, *, outside_tests: bool = False) -> None:
    """A phase of the tier, shown in the per-tier summary at the end of the run. A phase run
    outside any test (the build, before the first test) adds to the tier's total; the others
    are already in the durations of the tests whose fixtures ran them."""
    record_tier_time("node", what, seconds, outside_tests=outside_tests)


def _mark_node_items(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)


def _cannot_run(reason: str) -> NoReturn:
    if REQUIRE:
        pytest.fail(
            f"CORRAL_REQUIRE_NODE is set and the real node cannot run: {reason}", pytrace=False
        )
    pytest.skip(f"the real node cannot run here: {reason} (set CORRAL_REQUIRE_NODE=1 to fail)")


# The build may outlast a test's timeout on a cold machine (tens of minutes): it runs in a
# thread from the end of collection, while other tiers' tests run on this and the other
# workers, and the first test of the tier that needs the node waits for it under this timeout.
BUILD_TIMEOUT = 3600.0
_build: dict[str, realnode.Artifacts | str] = {}
_build_thread: threading.Thread | None = None


def _needs_node(item: pytest.Item) -> bool:
    here = Path(__file__).parent
    return here in Path(str(item.fspath)).parents and bool(
        {"node_artifacts", "target"} & set(getattr(item, "fixturenames", ()))
    )


def _run_build() -> None:
    start = time.monotonic()
    try:
        _build["artifacts"] = realnode.build(timeout=BUILD_TIMEOUT)
    except realnode.NodeError as e:
        _build["error"] = str(e)
    except Exception as e:  # reported by the fixture, not lost in a thread
        _build["error"] = f"{type(e).__name__}: {e}"
    _timed("build (hack/node, beside the tests)", time.monotonic() - start)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is marked `node`; the first that needs the node also waits for its
    build, and its timeout covers it."""
    _mark_node_items(items)
    first = next((item for item in items if _needs_node(item)), None)
    if first is not None:
        first.add_marker(pytest.mark.timeout(BUILD_TIMEOUT + 600), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the node and images once collection is done, in a thread: every worker
    starts it (the build scripts take a lock each and a warm cache answers in about a second),
    so the worker that runs the tier finds it built or under way, and a cold build overlaps the
    other tiers instead of holding up the first test."""
    global _build_thread
    if session.config.option.collectonly or _build_thread is not None:
        return
    if not any(_needs_node(item) for item in session.items):
        return  # none of the collected tests needs the node (e.g. only test_chart.py)
    if _target.external_requested() or realnode.unavailable_reason():
        return  # the fixtures report it
    _build_thread = threading.Thread(target=_run_build, name="node build", daemon=True)
    _build_thread.start()
    _start_earlier_builds(session.items)


# An earlier commit's chart and images (corral_dev.earlier), for a module of the tier that names
# the commit in `EARLIER` (test_upgrade.py): built in a thread of its own once the working
# tree's build is done, so a cold build overlaps the other tiers and never holds up the node.
_earlier: dict[str, earlier.Earlier | str] = {}
_earlier_threads: dict[str, threading.Thread] = {}


def _run_earlier_build(commit: str) -> None:
    if _build_thread is not None:
        _build_thread.join(BUILD_TIMEOUT)
    try:
        built = earlier.build(commit, timeout=BUILD_TIMEOUT)
    except realnode.NodeError as e:
        _earlier[commit] = str(e)
        return
    except Exception as e:  # reported by the fixture, not lost in a thread
        _earlier[commit] = f"{type(e).__name__}: {e}"
        return
    _earlier[commit] = built
    how = "built" if built.built else "cached"
    _timed(f"commit {commit[:7]}'s worktree and images ({how}, beside the tests)", built.seconds)


def _start_earlier_builds(items: list[pytest.Item]) -> None:
    for item in items:
        commit = getattr(getattr(item, "module", None), "EARLIER", None)
        if isinstance(commit, str) and _needs_node(item) and commit not in _earlier_threads:
            thread = threading.Thread(
                target=_run_earlier_build, args=(commit,), name=f"build {commit[:7]}", daemon=True
            )
            _earlier_threads[commit] = thread
            thread.start()


@pytest.fixture(scope="session")
def earlier_build(node_artifacts: realnode.Artifacts) -> Callable[[str], earlier.Earlier]:
    """`earlier_build(commit)`: that commit's worktree and images, from the build started after
    collection (waited for), or built now."""

    def wait(commit: str) -> earlier.Earlier:
        thread = _earlier_threads.get(commit)
        if thread is None:
            _run_earlier_build(commit)
        else:
            thread.join(BUILD_TIMEOUT)
            if thread.is_alive():
                _cannot_run(f"building commit {commit[:7]} took over {BUILD_TIMEOUT:.0f}s")
        built = _earlier.get(commit)
        if not isinstance(built, earlier.Earlier):
            _cannot_run(f"building commit {commit[:7]} failed: {built}")
        return built

    return wait


@pytest.fixture(scope="session")
def node_artifacts() -> realnode.Artifacts:
    if _target.external_requested():
        pytest.skip("CORRAL_E2E_KUBECONFIG names another cluster: the real node does not run")
    reason = realnode.unavailable_reason()
    if reason:
        _cannot_run(reason)
    if _build_thread is None:  # collected without the hook (e.g. --co)
        _run_build()
    else:
        _build_thread.join(BUILD_TIMEOUT)
        if _build_thread.is_alive():
            _cannot_run(f"building it took over {BUILD_TIMEOUT:.0f}s")
    if "error" in _build:
        _cannot_run(f"building it failed: {_build['error']}")
    built = _build.get("artifacts")
    assert isinstance(built, realnode.Artifacts)
    return built


@pytest.fixture(scope="session")
def node_plane(node_artifacts: realnode.Artifacts) -> Iterator[controlplane.ControlPlane]:
    """A control plane of the node tier's own, its Services in 198.19.0.0/16."""
    state = Path(tempfile.mkdtemp(prefix="corral-cp-node-"))
    start = time.monotonic()
    with mock.patch.object(controlplane, "SERVICE_CIDR", realnode.NODE_SERVICE_CIDR):
        plane = controlplane.start(state)
    _timed("control plane start", time.monotonic() - start)
    try:
        controlplane.install_crds(plane)
        yield plane
    finally:
        plane.stop()


_host_rules: dict[str, set[str]] = {}


@pytest.fixture
def host_rules_before(real_node: realnode.RealNode) -> set[str]:
    """The host's iptables rules from just before the node started."""
    return _host_rules["before"]


@pytest.fixture(scope="session")
def real_node(
    node_plane: controlplane.ControlPlane, node_artifacts: realnode.Artifacts
) -> Iterator[realnode.RealNode]:
    work = Path(tempfile.mkdtemp(prefix="corral-realnode-"))
    _host_rules["before"] = host_iptables_rules()
    start = time.monotonic()
    try:
        node = realnode.start(
            node_plane, work, artifacts=node_artifacts, service_cidr=realnode.NODE_SERVICE_CIDR
        )
    except realnode.NodeError as e:
        _cannot_run(f"starting it failed: {e}")
    _timed("node start", time.monotonic() - start)
    try:
        yield node
    finally:
        start = time.monotonic()
        problems = node.stop()
        _timed("node stop", time.monotonic() - start)
        assert not problems, f"the real node's teardown left: {problems}"
        added = host_iptables_rules() - _host_rules["before"]
        assert not added, f"this host's iptables rules changed: {sorted(added)[:20]}"


@pytest.fixture
def node_namespace(
    node_plane: controlplane.ControlPlane, real_node: realnode.RealNode
) -> Iterator[str]:
    """A fresh namespace where Pod Security `restricted` is enforced."""
    name = f"n{os.getpid()}-{next(_counter)}"
    node_plane.kubectl("create", "namespace", name)
    node_plane.kubectl(
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    controlplane.wait_for_default_service_account(node_plane, name)
    yield name
    node_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> _target.Target:
    """The cluster Corral's tests run against: the environment's (CORRAL_E2E_KUBECONFIG), or
    the real node with its control plane."""
    if _target.external_requested():
        try:
            return _target.external(controlplane.binaries())
        except (ValueError, controlplane.ControlPlaneError) as e:
            pytest.fail(str(e), pytrace=False)
    plane: controlplane.ControlPlane = request.getfixturevalue("node_plane")
    node: realnode.RealNode = request.getfixturevalue("real_node")
    return _target.Target(
        name=f"real node {node.name}",
        kubeconfig=plane.kubeconfig,
        bin_dir=plane.bin_dir,
        host_ip=node.addrs.host_ip,
        operator_image=node.artifacts["OPERATOR_IMAGE"],
        sandbox_image=node.artifacts["SANDBOX_IMAGE"],
    )
