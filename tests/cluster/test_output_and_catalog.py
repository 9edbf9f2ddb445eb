"""Structured output and the model catalog on the real API server, operator and local node.

- A Session with `spec.outputSchema` ends with the validated object in `status.output`, read
  with `kubectl get -o jsonpath` as a CI job would; a schema that is not an object is refused by
  the API server, one that is not a valid JSON Schema makes the Session `InvalidSpec`.
- A model added only through the chart's catalog ConfigMap is accepted by the harness and the
  custodian of a sandbox pod (no rebuild), priced from the overlay; an unknown model is refused at
  admission with the list of known names.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral_dev import stack

from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(150)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["verdict", "score"],
    "additionalProperties": False,
    "properties": {
        "verdict": {"enum": ["pass", "fail"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
}
ACME = {
    "name": "acme-coder-1",
    "contextWindow": 128000,
    "maxOutputTokens": 16000,
    "thinking": False,
    "prices": {"input": 2, "output": 8, "cacheRead": 0.2, "cacheWrite": 2.5},
}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def test_status_output_holds_the_validated_answer_for_kubectl_jsonpath(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    name = "structured"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"text": "It passes."},  # prose: sent back with the errors
                    {"text": json.dumps({"verdict": "pass", "score": 9})},
                ]
            }
        }
    )
    operator.apply(agent_doc(), session_doc(name, git_repo, outputSchema=SCHEMA))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["output"] == {"verdict": "pass", "score": 9}
    assert status["turns"] == 1  # the send-back is inside the turn
    read = operator.cp.kubectl(
        "get", "session", name, "-n", operator.namespace, "-o", "jsonpath={.status.output.verdict}"
    )
    assert read.stdout == "pass"
    stored = operator.get("session", name) or {}
    assert stored["spec"]["outputSchema"] == SCHEMA  # preserved as written


def test_an_answer_that_stays_invalid_fails_the_session_output_invalid(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    name = "structured-bad"
    wrong = {"text": json.dumps({"verdict": "maybe", "score": 11})}
    scripted_model.load({"conversations": {name: [wrong, wrong, wrong]}})
    operator.apply(agent_doc(), session_doc(name, git_repo, outputSchema=SCHEMA))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Failed", status
    assert status["lastSettlement"]["error"].startswith("output_invalid: ")
    assert "$.score: 11 is greater than the maximum of 10" in status["lastSettlement"]["error"]
    assert "output" not in status


def test_the_api_server_refuses_an_output_schema_that_is_not_an_object(
    operator: OperatorHandle, git_repo: Any
) -> None:
    doc = session_doc("schema-string", git_repo, outputSchema="return JSON please")
    doc["metadata"]["namespace"] = operator.namespace
    done = operator.cp.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
    assert done.returncode != 0
    assert "spec.outputSchema" in done.stderr and "must be of type object" in done.stderr


def test_an_output_schema_that_is_no_json_schema_makes_the_session_invalid_spec(
    operator: OperatorHandle, git_repo: Any
) -> None:
    name = "schema-wrong"
    operator.apply(agent_doc(), session_doc(name, git_repo, outputSchema={"type": "objekt"}))
    status = operator.wait_phase(name, {"Failed"})
    assert _condition(status, "Failed")["reason"] == "InvalidSpec"
    assert "outputSchema is not a valid JSON Schema at type" in status["message"]


def test_a_model_added_by_the_catalog_configmap_runs_and_an_unknown_one_is_refused(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    # The chart made the (empty) ConfigMap in the namespace; the platform adds one model to it.
    operator.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "corral-model-catalog"},
            "data": {"models.json": json.dumps({"models": [ACME]})},
        }
    )
    # The operator as the chart runs it: it mounts that ConfigMap into every sandbox.
    operator.stop()
    operator.args += ["--model-catalog-configmap", "corral-model-catalog"]
    operator.start()
    health = operator.args[operator.args.index("--liveness") + 1]
    stack.wait_serving("the operator", health, operator.process, operator.log)

    known, unknown = "catalog-known", "catalog-unknown"
    scripted_model.load({"conversations": {known: [{"text": "Done with acme."}]}})
    # A cost budget: the custodian refuses a model it cannot price, so this passes only when
    # the custodian, not just the harness, read the overlay.
    acme_agent = agent_doc("acme", model="acme-coder-1", limits={"budget": {"costUSD": 5}})
    operator.apply(
        acme_agent,
        agent_doc("nowhere", model="acme-coder-9"),
        session_doc(known, git_repo, agent="acme"),
        session_doc(unknown, git_repo, agent="nowhere"),
    )
    status = operator.wait_phase(known, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    (request,) = scripted_model.requests(known)
    assert request["body"]["model"] == "acme-coder-1"
    assert request["body"]["max_tokens"] == 16000  # the overlay's maximum
    assert status["usage"]["cost"] > 0  # priced from the overlay (unknown models cost 0)
    pod = operator.get("pod", f"corral-{known}") or {}
    if pod:  # released after the end unless kept; when still there, check what it mounts
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        for role in ("harness", "custodian"):
            env = {e["name"]: e.get("value") for e in containers[role]["env"]}
            assert env["CORRAL_MODEL_CATALOG"] == "/etc/corral/catalog/models.json"
        assert "CORRAL_MODEL_CATALOG" not in str(containers["tools"])

    refused = operator.wait_phase(unknown, {"Succeeded", "Failed"})
    assert refused["phase"] == "Failed", refused
    assert "unknown model 'acme-coder-9'" in refused["message"]
    assert "acme-coder-1" in refused["message"] and "claude-opus-4-5" in refused["message"]
