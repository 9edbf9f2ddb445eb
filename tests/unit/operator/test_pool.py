"""The warm pool's planner and manifests: pure functions on plain dicts (docs/warm-pool.md)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from corral_operator import naming
from corral_operator.builders.podbuilder import build_pod, owner_reference, sandbox_labels
from corral_operator.builders.poolpod import (
    ADOPT_KEY_ENV,
    ANNOTATION_DIGEST,
    LABEL_POOL,
    agent_digest,
    build_pool_network_policy,
    build_pool_pod,
)
from corral_operator.planning.pool import (
    adoptable,
    claim_patch,
    plan_pool,
    pool_size,
    warm_refusal,
)
from corral_operator.settings import OperatorSettings
from tests._objects import agent, session

SETTINGS = OperatorSettings(image="corral/sandbox:test", operator_namespace="corral-system")
HARNESS_KEY, CUSTODIAN_KEY = "h" * 43, "k" * 43


def _pod(
    name: str,
    digest: str = "d1",
    *,
    ready: bool = True,
    component: str = "pool",
    phase: str = "Running",
    created: str = "2026-11-30T10:00:00Z",
    deleting: bool = False,
) -> dict[str, Any]:
    md: dict[str, Any] = {
        "name": name,
        "resourceVersion": "7",
        "creationTimestamp": created,
        "labels": {LABEL_POOL: "coder", naming.LABEL_COMPONENT: component},
        "annotations": {ANNOTATION_DIGEST: digest},
    }
    if deleting:
        md["deletionTimestamp"] = "2026-11-30T10:05:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": md,
        "status": {"phase": phase, "podIP": "198.18.0.9", "conditions": conditions},
    }


# -------------------------------------------------------------------------------- planner


def test_an_empty_pool_is_filled_to_its_size() -> None:
    assert plan_pool(3, "d1", []).create == 3


def test_adopted_and_going_pods_do_not_count_towards_the_pool() -> None:
    pods = [_pod("a", component="sandbox"), _pod("b", deleting=True), _pod("c")]
    plan = plan_pool(2, "d1", pods)
    assert plan.create == 1 and plan.delete == []


def test_stale_pods_are_replaced_after_an_agent_change() -> None:
    plan = plan_pool(2, "d2", [_pod("a", "d1"), _pod("b", "d1"), _pod("c", "d2")])
    assert sorted(plan.delete) == ["a", "b"]
    assert plan.create == 1
    assert "stale" in plan.reasons["a"]


def test_finished_pods_are_removed_and_replaced() -> None:
    plan = plan_pool(1, "d1", [_pod("a", phase="Failed")])
    assert plan.delete == ["a"] and plan.create == 1


def test_a_surplus_goes_unready_first_then_newest() -> None:
    pods = [
        _pod("old-ready", created="2026-11-30T10:00:00Z"),
        _pod("new-ready", created="2026-11-30T10:02:00Z"),
        _pod("unready", ready=False, created="2026-11-30T09:00:00Z"),
    ]
    assert plan_pool(2, "d1", pods).delete == ["unready"]
    assert plan_pool(1, "d1", pods).delete == ["unready", "new-ready"]
    assert plan_pool(0, "d1", pods).create == 0


def test_the_pool_size_is_the_ready_agents_own() -> None:
    ready = [{"type": "Ready", "status": "True"}]
    body: dict[str, Any] = {
        "metadata": {"name": "coder"},
        "spec": {"sandbox": {"warmPool": {"size": 4}}},
        "status": {"conditions": ready},
    }
    assert pool_size(body) == 4
    assert pool_size(None) == 0
    assert pool_size({**body, "status": {"conditions": []}}) == 0  # not validated: none
    going = {**body, "metadata": {"name": "coder", "deletionTimestamp": "x"}}
    assert pool_size(going) == 0
    assert pool_size({**body, "spec": {}}) == 0


def test_a_session_adopts_only_ready_pooled_pods_of_the_current_digest_oldest_first() -> None:
    pods = [
        _pod("stale", "d0"),
        _pod("unready", ready=False),
        _pod("adopted", component="sandbox"),
        _pod("newer", created="2026-11-30T10:03:00Z"),
        _pod("older", created="2026-11-30T10:01:00Z"),
    ]
    assert [p["metadata"]["name"] for p in adoptable(pods, "d1")] == ["older", "newer"]


def test_sessions_the_pool_cannot_serve_get_cold_pods() -> None:
    warm = agent(sandbox={"warmPool": {"size": 2}})
    assert warm_refusal(warm, session()) is None
    assert warm_refusal(agent(), session()) is not None
    assert warm_refusal(agent(sandbox={"warmPool": {"size": 0}}), session()) is not None
    deeper = session(
        workspace={"repo": "https://g/r.git", "ref": "main", "grantedRoot": "/workspace/sub"}
    )
    assert "granted root" in str(warm_refusal(warm, deeper))


def test_the_claim_is_a_compare_and_swap_that_relabels_and_reowns() -> None:
    s = session()
    owner = owner_reference("Session", "fix-bug", "uid-1")
    patch = claim_patch(_pod("a"), sandbox_labels(s), owner)
    md = patch["metadata"]
    assert md["resourceVersion"] == "7"
    assert md["labels"][naming.LABEL_COMPONENT] == "sandbox"  # the Session's policy selects it
    assert md["labels"][naming.LABEL_SESSION] == "fix-bug"
    assert md["labels"][LABEL_POOL] == "coder"  # where it came from stays visible
    assert md["ownerReferences"] == [owner]
    assert "annotations" not in md  # no gateway, no binding
    bound = claim_patch(_pod("a"), sandbox_labels(s), owner, {"corral.dev/egress-binding": "{}"})
    assert bound["metadata"]["annotations"] == {"corral.dev/egress-binding": "{}"}


# ------------------------------------------------------------------------------ manifests


def test_a_pooled_pod_holds_nothing_of_a_session_and_no_key() -> None:
    a = agent(sandbox={"warmPool": {"size": 1}})
    built = build_pool_pod(a, SETTINGS, "corral-warm-coder-1", HARNESS_KEY, CUSTODIAN_KEY)
    pod = built.pod
    text = json.dumps(pod)
    assert HARNESS_KEY not in text and CUSTODIAN_KEY not in text
    for word in ("CORRAL_SESSION_", "CORRAL_WIRE_TOKEN_FILE", "CORRAL_AGENT_SPEC_JSON",
                 "CORRAL_BUDGET_", "CORRAL_GIT_REMOTE_URL", "checkout"):  # fmt: skip
        assert word not in text, word
    spec = pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["install-exec"]
    assert "wire" not in {v["name"] for v in spec["volumes"]}
    containers = {c["name"]: c for c in spec["containers"]}
    envs = {n: {e["name"]: e.get("value") for e in c.get("env", [])} for n, c in containers.items()}
    assert envs["harness"][ADOPT_KEY_ENV] == hashlib.sha256(HARNESS_KEY.encode()).hexdigest()
    assert envs["custodian"][ADOPT_KEY_ENV] == hashlib.sha256(CUSTODIAN_KEY.encode()).hexdigest()
    assert ADOPT_KEY_ENV not in envs["tools"]
    assert pod["metadata"]["annotations"][ANNOTATION_DIGEST] == agent_digest(a, SETTINGS)
    assert pod["metadata"]["labels"][naming.LABEL_COMPONENT] == "pool"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Agent"


def test_a_pooled_pod_keeps_every_security_property_of_a_cold_pod() -> None:
    a = agent(sandbox={"warmPool": {"size": 1}})
    pooled = build_pool_pod(a, SETTINGS, "p", HARNESS_KEY, CUSTODIAN_KEY).pod["spec"]
    cold = build_pod(a, session(), SETTINGS)["spec"]
    for field in ("securityContext", "automountServiceAccountToken", "serviceAccountName"):
        assert pooled[field] == cold[field]
    for p, c in zip(pooled["containers"], cold["containers"], strict=True):
        assert p["securityContext"] == c["securityContext"]
        assert p["resources"] == c["resources"]
        assert p["image"] == c["image"]


def test_the_key_secret_is_the_pods_and_holds_both_keys() -> None:
    a = agent(sandbox={"warmPool": {"size": 1}})
    built = build_pool_pod(a, SETTINGS, "corral-warm-coder-1", HARNESS_KEY, CUSTODIAN_KEY)
    secret = built.key_secret("pod-uid")
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "corral-warm-coder-1", "uid": "pod-uid"}
    ]
    assert secret["stringData"] == {"harness": HARNESS_KEY, "custodian": CUSTODIAN_KEY}


def test_an_agent_change_or_a_new_image_changes_the_digest() -> None:
    a = agent(sandbox={"warmPool": {"size": 1}})
    b = agent(instructions="Something else.", sandbox={"warmPool": {"size": 1}})
    assert agent_digest(a, SETTINGS) != agent_digest(b, SETTINGS)
    other = OperatorSettings(image="corral/sandbox:next", operator_namespace="corral-system")
    assert agent_digest(a, SETTINGS) != agent_digest(a, other)
    assert agent_digest(a, SETTINGS) == agent_digest(
        agent(sandbox={"warmPool": {"size": 1}}), SETTINGS
    )


def test_the_pool_policy_lets_no_traffic_out_and_only_the_operator_in() -> None:
    policy = build_pool_network_policy(agent(sandbox={"warmPool": {"size": 1}}), SETTINGS)
    spec = policy["spec"]
    assert spec["egress"] == [] and spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["podSelector"]["matchLabels"] == {
        LABEL_POOL: "coder",
        naming.LABEL_COMPONENT: "pool",
    }
    (rule,) = spec["ingress"]
    assert {p["port"] for p in rule["ports"]} == {
        SETTINGS.harness_port,
        SETTINGS.custodian_operator_port,
    }


def test_a_pooled_pod_mounts_no_session_secret_and_its_adopt_carries_the_memory_dsn() -> None:
    """The memory DSN is an item of the Session's Secret, which a pooled pod cannot mount (it
    does not exist yet): the custodian's adopt carries it instead."""
    import dataclasses

    from corral_operator.session.adoption import adopt_requests

    dsn = "postgresql://corral:pw@memory.db:5432/corral"
    settings = dataclasses.replace(SETTINGS, memory_dsn=dsn)
    warm = agent(sandbox={"warmPool": {"size": 1}})
    pod = build_pool_pod(warm, settings, "coder-warm-1", "h" * 43, "c" * 43).pod
    secrets = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert secrets == [], secrets
    custodian = next(c for c in pod["spec"]["containers"] if c["name"] == "custodian")
    assert "CORRAL_MEMORY_DSN_FILE" not in {e["name"] for e in custodian["env"]}
    told, _ = adopt_requests(settings, warm, session(), "w" * 43, "c" * 43, None)
    assert told.memoryDsn == dsn
    told, _ = adopt_requests(SETTINGS, warm, session(), "w" * 43, "c" * 43, None)
    assert told.memoryDsn is None
