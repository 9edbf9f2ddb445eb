"""Fixtures for tests against the real local control plane (etcd + kube-apiserver + KCM)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_dev import controlplane

from ._node_fixtures import *  # noqa: F403
from ._operator_fixtures import git_repo, operator, scripted_model  # noqa: F401

_counter = itertools.count()
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


# Package scope: the attack tier and this one each stop their control plane when their last
# test is done, instead of leaving it idle beside the rest of the run.
@pytest.fixture(scope="package")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    state = Path(tempfile.mkdtemp(prefix="corral-cp-"))
    plane = controlplane.start(state, controllers=controlplane.SESSION_CONTROLLERS)
    try:
        controlplane.install_crds(plane)
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def namespace(control_plane: controlplane.ControlPlane) -> Iterator[str]:
    """A fresh namespace where Pod Security `restricted` is enforced."""
    name = f"t{os.getpid()}-{next(_counter)}"
    control_plane.create_namespace(name, RESTRICTED)
    controlplane.wait_for_default_service_account(control_plane, name)
    yield name
    control_plane.release_namespace(name)
