"""The malicious-agent suite runs on the same real control plane and local node as the cluster
tier: the local node runs each container as its own uid in its own mount namespace, so what the
agent's shell cannot reach here it could not reach in a real pod either (egress, which the local
node does not police, is proved on the real node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster._node_fixtures import *  # noqa: F403
from tests.cluster._operator_fixtures import git_repo, operator, scripted_model  # noqa: F401
from tests.cluster.conftest import control_plane, namespace  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)
