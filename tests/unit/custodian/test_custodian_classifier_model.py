"""The scheduler's classifier model goes through the custodian like every model call: it is
admitted when the Agent names it (`spec.scheduler.classifierModel`), and refused otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._scripted import ScriptedServer

from ._custodian_proc import running_custodian
from .test_custodian_model import body, post, refusal, upstream  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)


def test_the_classifier_model_is_admitted_only_when_the_agent_names_it(
    upstream: ScriptedServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    url = upstream.url
    spec = {"identity": "x", "model": "claude-sonnet-4-5"}
    plain = {"CORRAL_UPSTREAM_URL": url, "CORRAL_AGENT_SPEC_JSON": json.dumps(spec)}
    with running_custodian(plain, tmp_path / "plain.log") as custodian:
        message = refusal(
            post(custodian, body(model="claude-haiku-4-5")), 403, "permission_error", False
        )
        assert "'claude-haiku-4-5' is not allowed" in message
    spec["scheduler"] = {"classifierModel": "claude-haiku-4-5"}  # type: ignore[assignment]
    named = {"CORRAL_UPSTREAM_URL": url, "CORRAL_AGENT_SPEC_JSON": json.dumps(spec)}
    with running_custodian(named, tmp_path / "named.log") as custodian:
        assert post(custodian, body(model="claude-haiku-4-5")).status_code == 200
        assert post(custodian, body(model="claude-sonnet-4-5")).status_code == 200
        refusal(post(custodian, body(model="claude-opus-4-1")), 403, "permission_error", False)
