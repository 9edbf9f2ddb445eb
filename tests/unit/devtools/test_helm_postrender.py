"""The dev cluster's helm post-renderer (`make dev-cluster NODE=real`): the operator's
development flags land in the chart's operator container alone, and a chart without that
container is an error rather than flags silently dropped."""

from __future__ import annotations

import pytest

from corral_dev._helm_postrender import with_operator_args


def test_the_flag_is_appended_to_the_operator_container_only() -> None:
    docs = [
        {"kind": "Service", "spec": {}},
        {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
            {"name": "gateway", "args": ["--x"]}, {"name": "operator", "args": ["--a"]},
        ]}}}},
    ]  # fmt: skip
    out = with_operator_args(docs, ["--local-repo-root=git://198.18.128.1:20001/"])
    gateway, operator = out[1]["spec"]["template"]["spec"]["containers"]
    assert operator["args"] == ["--a", "--local-repo-root=git://198.18.128.1:20001/"]
    assert gateway["args"] == ["--x"]
    with pytest.raises(SystemExit, match="no Deployment has a container 'operator'"):
        with_operator_args([{"kind": "Service"}], ["--y"])
