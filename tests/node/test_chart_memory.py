"""The chart's long-term memory values (docs/memory.md), rendered with `helm template`: no
store by default; an existing Secret or a deployed StatefulSet hands the operator the DSN as a
file; both at once is refused by the values schema."""

from __future__ import annotations

from typing import Any

from .test_chart import find, helm_template, operator_deployment, rendered

WATCH = 'watchNamespaces=["default"]'


def _operator(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(operator_deployment(docs)["spec"]["template"]["spec"])


def test_no_store_by_default() -> None:
    docs = rendered(WATCH)
    spec = _operator(docs)
    assert not any("memory" in a for a in spec["containers"][0]["args"])
    assert find(docs, "StatefulSet") == []


def test_an_existing_secret_is_mounted_into_the_operator() -> None:
    spec = _operator(rendered(WATCH, 'memory={"postgres": {"existingSecret": "team-db"}}'))
    assert "--memory-dsn-file=/etc/corral/memory/dsn" in spec["containers"][0]["args"]
    volume = next(v for v in spec["volumes"] if v["name"] == "memory")
    assert volume["secret"]["secretName"] == "team-db"
    assert volume["secret"]["items"] == [{"key": "dsn", "path": "dsn"}]


def test_deploy_renders_a_statefulset_and_its_secret() -> None:
    docs = rendered(
        WATCH, 'memory={"postgres": {"deploy": true, "image": "registry.example/pg:15"}}'
    )
    (stateful,) = find(docs, "StatefulSet", "corral-system")
    container = stateful["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/pg:15"
    assert stateful["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    secret = next(s for s in find(docs, "Secret") if s["metadata"]["name"] == "corral-memory")
    dsn = secret["stringData"]["dsn"]
    assert dsn.startswith("postgresql://corral:") and "@corral-memory.corral-system.svc" in dsn
    assert secret["stringData"]["password"] in dsn
    spec = _operator(docs)
    assert next(v for v in spec["volumes"] if v["name"] == "memory")["secret"]["secretName"] == (
        "corral-memory"
    )


def test_both_at_once_is_refused() -> None:
    done = helm_template(
        WATCH, 'memory={"postgres": {"deploy": true, "existingSecret": "team-db"}}'
    )
    assert done.returncode != 0 and "memory/postgres" in done.stderr
