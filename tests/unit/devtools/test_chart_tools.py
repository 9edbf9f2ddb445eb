"""The chart's own tools (hack/): the README generator reads values.yaml's comments as the
chart's reference and refuses a value it cannot document; the scan's accepted findings are
judged by check id and resource, and each is justified in docs/security.md; the sandbox pod
the scan reads is the builder's, without a credential in it."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
HACK = REPO / "hack"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), HACK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


readme = _load("chart-readme")
check = _load("chart-check")

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "definitions": {"resources": {"type": "object", "properties": {"limits": {}}}},
    "properties": {
        "replicas": {"type": "integer"},
        "resources": {"$ref": "#/definitions/resources"},
        "gateway": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"port": {"type": "integer"}, "hosts": {"type": "object"}},
        },
    },
}


def test_the_checked_in_readme_is_what_values_yaml_says() -> None:
    assert (REPO / "charts" / "corral" / "README.md").read_text() == readme.generate()


def test_sections_rows_unset_values_and_examples() -> None:
    text = """# A free note, documenting nothing.

# @value watch
# The namespaces; no default.

# How many.
replicas: 1
# Requests and limits: one row, not a section.
resources:
  limits:
    cpu: "1"
# The gateway. E.g.
#   port: 3128
gateway:
  # Its port.
  port: 3128
  # Names to addresses, e.g. `{"a.example": ["192.0.2.1"]}`.
  hosts: {}
"""
    out = readme.render(readme.parse(text, SCHEMA))
    assert "| `watch` | required | The namespaces; no default. |" in out
    assert "| `replicas` | `1` | How many. |" in out
    assert '| `resources` | `{"limits": {"cpu": "1"}}` | Requests and limits' in out
    assert "### `gateway`\n\nThe gateway. E.g.\n\n```yaml\nport: 3128\n```" in out
    assert "| `gateway.port` | `3128` | Its port. |" in out
    assert "A free note" not in out


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("replicas: 1\n", "values.yaml:1: replicas has no comment above it"),
        ("# How many.\n\nreplicas: 1\n", "replicas has no comment above it"),  # not adjacent
        ("# The gateway.\ngateway:\n  port: 1\n", "gateway.port has no comment above it"),
        ("# Unknown.\nreplica: 1\n", "replica is not in values.schema.json"),
    ],
)
def test_a_value_it_cannot_document_is_refused_naming_it(text: str, problem: str) -> None:
    with pytest.raises(readme.ValuesError, match=re.escape(problem)):
        readme.parse(text, SCHEMA)


def test_an_example_in_a_leafs_comment_is_refused() -> None:
    text = "# The gateway.\ngateway:\n  # Its port, e.g.\n  #   3128\n  port: 3128\n"
    with pytest.raises(readme.ValuesError, match=re.escape("gateway.port: an indented example")):
        readme.render(readme.parse(text, SCHEMA))


def test_the_scan_fails_on_a_new_finding_and_on_a_stale_acceptance() -> None:
    allowed = {("CKV_K8S_11", "Deployment.ns.op"): "throttling"}
    assert check.judge({("CKV_K8S_11", "Deployment.ns.op")}, allowed) == []
    # The same check on another resource is a new finding: acceptance is per resource.
    new = check.judge({("CKV_K8S_11", "Deployment.ns.op"), ("CKV_K8S_11", "Pod.ns.x")}, allowed)
    assert len(new) == 1 and "new finding CKV_K8S_11 on Pod.ns.x" in new[0]
    stale = check.judge(set(), allowed)
    assert len(stale) == 1 and "no longer occurs" in stale[0]


def test_every_accepted_finding_is_justified_in_the_security_doc() -> None:
    accepted = yaml.safe_load((HACK / "checkov-accepted.yaml").read_text())
    security = (REPO / "docs" / "security.md").read_text()
    table = security[security.index("## The chart's manifest scan") :]
    documented = set(re.findall(r"^\| (CKV\w+) \|", table, re.MULTILINE))
    assert documented == set(accepted)
    for check_id, entry in accepted.items():
        assert entry["why"].strip() and entry["resources"], check_id


def test_the_sandbox_pod_the_scan_reads_is_the_builders_without_credentials() -> None:
    done = subprocess.run(
        [sys.executable, str(HACK / "render-sandbox-pod.py")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    docs = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in docs] == ["Secret", "NetworkPolicy", "Pod"]
    pod = docs[2]
    assert {c["name"] for c in pod["spec"]["containers"]} == {"harness", "tools", "custodian"}
    # Behind the gateway: the policy lets the pod reach the gateway's pods alone.
    assert json.dumps(docs[1]["spec"]["egress"]).count("corral-egress-gateway") == 1
    for secret in ("w" * 43, "c" * 43, "e" * 43):
        assert secret not in done.stdout
