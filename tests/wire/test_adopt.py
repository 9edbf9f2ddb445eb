"""A pooled harness and a pooled custodian before and after adoption (docs/warm-pool.md).

Real processes: `corral-harness` and `corral-custodian` started as a warm-pool pod starts them,
with only the SHA-256 of their one-time key; the operator's adopt request (the wire shapes of
`corral_api.wire`) binds them to a Session. The turn after adoption runs through the real SDK
against the scripted model, in the repository the adopt checked out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_api.wire import (
    AdoptedSession,
    AdoptResponse,
    CheckoutRequest,
    CustodianAdoptRequest,
    CustodianBudget,
    HarnessAdoptRequest,
)
from corral_dev.ports import free_port

from ._rig import AGENT, Harness, Model, new_conversation

pytestmark = pytest.mark.timeout(90)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    run = {"cwd": repo, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q", "-b", "main"], **run)  # type: ignore[call-overload]
    (repo / "README.md").write_text("# adopted\n")
    subprocess.run(["git", "add", "README.md"], **run)  # type: ignore[call-overload]
    subprocess.run(  # type: ignore[call-overload]
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"], **run
    )
    return repo


@pytest.fixture
def pooled(tmp_path: Path, model: Model) -> Iterator[tuple[Harness, str]]:
    key = secrets.token_urlsafe(32)
    (tmp_path / "state").mkdir()
    (tmp_path / "root").mkdir()
    proc = Harness(
        model.url,
        None,
        tmp_path / "state",
        tmp_path / "root",
        extra_env={"CORRAL_ADOPT_KEY_SHA256": _digest(key)},
    )
    proc.start()
    yield proc, key
    proc.stop()


def _adopt(url: str, key: str | None, body: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url, json=body, headers=headers, timeout=60)


def test_a_pooled_harness_answers_only_readyz_and_adopt_then_serves_its_session(
    pooled: tuple[Harness, str], origin: Path, model: Model
) -> None:
    harness, key = pooled
    ready = httpx.get(f"{harness.url}/readyz", timeout=5)
    assert ready.status_code == 200 and ready.json()["adopted"] is False
    conv = new_conversation()
    # Before adoption: nothing of the wire, not even with a made-up token.
    for method, path in (
        ("POST", f"/agents/agent/{conv}"),
        ("GET", f"/agents/agent/{conv}/updates"),
        ("GET", f"/agents/agent/{conv}/history"),
        ("POST", f"/agents/agent/{conv}/abort"),
        ("POST", "/checks"),
        ("GET", "/metrics"),
    ):
        refused = httpx.request(
            method, f"{harness.url}{path}", headers={"authorization": "Bearer x"}, timeout=5
        )
        assert refused.status_code == 423, (path, refused.text)
        assert refused.json()["error"] == "not_adopted"

    token, credential = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    request = HarnessAdoptRequest(
        wireToken=token,
        custodianCredential=credential,
        grantedRoot=str(harness.root),
        checkout=CheckoutRequest(repo=str(origin), ref="main", branch="corral/s1"),
    ).model_dump()
    # Wrong key, no key: refused, and the key is not spent by them.
    assert _adopt(f"{harness.url}/adopt", "not-the-key", request).status_code == 401
    assert _adopt(f"{harness.url}/adopt", None, request).status_code == 401
    adopted = _adopt(f"{harness.url}/adopt", key, request)
    assert adopted.status_code == 200, adopted.text
    assert AdoptResponse.model_validate(adopted.json()).adopted is True
    again = _adopt(f"{harness.url}/adopt", key, request)
    assert again.status_code == 409 and again.json()["error"] == "already_adopted"

    # The checkout is there, on the session's branch.
    assert (harness.root / "README.md").read_text() == "# adopted\n"
    head = (harness.root / ".git" / "HEAD").read_text().strip()
    assert head == "ref: refs/heads/corral/s1"

    # The wire now wants the delivered token, and a turn runs against the model.
    assert (
        httpx.post(f"{harness.url}/agents/agent/{conv}", json={"message": "hi"}).status_code == 401
    )
    harness.token = token
    model.script(conv, [{"text": "Adopted and done."}])
    admitted = harness.admit(conv, "hello", spec=AGENT)
    settled = harness.wait_settled(conv, admitted["submissionId"], admitted["offset"])
    assert settled["status"] == "completed", settled
    sent = [r for r in model.scripted.requests if r["conversation"] == conv]
    assert len(sent) == 1
    # The harness presents the delivered credential to its model endpoint (the custodian).
    assert sent[0]["headers"].get("x-api-key") == credential


def test_an_adopted_harness_stays_adopted_across_a_restart(
    pooled: tuple[Harness, str], origin: Path
) -> None:
    harness, key = pooled
    token = secrets.token_urlsafe(32)
    request = HarnessAdoptRequest(
        wireToken=token,
        custodianCredential=secrets.token_urlsafe(32),
        grantedRoot=str(harness.root),
        checkout=CheckoutRequest(repo=str(origin), ref="main", branch="corral/s2"),
    ).model_dump()
    assert _adopt(f"{harness.url}/adopt", key, request).status_code == 200
    harness.kill9()
    harness.start()
    assert _adopt(f"{harness.url}/adopt", key, request).status_code == 409
    harness.token = token
    conv = new_conversation()
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 404  # the wire, bound
    harness.token = "wrong-" + token
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 401


def test_a_failed_checkout_spends_the_key(pooled: tuple[Harness, str], tmp_path: Path) -> None:
    harness, key = pooled
    request = HarnessAdoptRequest(
        wireToken=secrets.token_urlsafe(32),
        custodianCredential=secrets.token_urlsafe(32),
        grantedRoot=str(harness.root),
        checkout=CheckoutRequest(repo=str(tmp_path / "nowhere"), ref="main", branch="corral/x"),
    ).model_dump()
    failed = _adopt(f"{harness.url}/adopt", key, request)
    assert failed.status_code == 500 and failed.json()["error"] == "checkout_failed"
    assert "nowhere" in failed.json()["reason"]
    assert _adopt(f"{harness.url}/adopt", key, request).status_code == 409
    assert httpx.get(f"{harness.url}/readyz", timeout=5).status_code == 503


# ------------------------------------------------------------------------------ custodian


@contextlib.contextmanager
def _pooled_custodian(
    tmp_path: Path, upstream: str, extra_env: dict[str, str] | None = None
) -> Iterator[tuple[str, str, str]]:
    key = secrets.token_urlsafe(32)
    port, op_port = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{port}",
        "CORRAL_CUSTODIAN_OPERATOR_ADDR": f"127.0.0.1:{op_port}",
        "CORRAL_STATE_DIR": str(tmp_path / "custodian"),
        "CORRAL_UPSTREAM_URL": upstream,
        "ANTHROPIC_API_KEY": "sk-scripted",
        "CORRAL_ADOPT_KEY_SHA256": _digest(key),
        **(extra_env or {}),
    }
    log = (tmp_path / "custodian.log").open("wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "corral-custodian")], env=env, stdout=log, stderr=log
    )
    url, op_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{op_port}"
    deadline = time.monotonic() + 20
    try:
        while True:
            assert proc.poll() is None, (tmp_path / "custodian.log").read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the pooled custodian did not become ready"
            time.sleep(0.05)
        yield url, op_url, key
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.fixture
def pooled_custodian(tmp_path: Path, model: Model) -> Iterator[tuple[str, str, str]]:
    with _pooled_custodian(tmp_path, model.url) as started:
        yield started


def test_a_pooled_custodian_refuses_everything_until_adopted_and_a_second_adopt(
    pooled_custodian: tuple[str, str, str], model: Model
) -> None:
    url, op_url, key = pooled_custodian
    for target in (f"{url}/v1/messages", f"{url}/agents/c/surface", f"{op_url}/v1/usage"):
        refused = httpx.request(
            "POST" if target.endswith("messages") else "GET", target, json={}, timeout=5
        )
        assert refused.status_code == 423, (target, refused.text)
    token, credential = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    request = CustodianAdoptRequest(
        wireToken=token,
        custodianCredential=credential,
        session=AdoptedSession(name="s1", namespace="team", uid="uid-1"),
        agentName="coder",
        agent=AGENT,  # type: ignore[arg-type]
        budget=CustodianBudget(tokens=5000),
        branch="corral/s1",
        gitRemoteUrl="https://example.invalid/r.git",
    ).model_dump(mode="json", by_alias=True)
    # The adopt is the operator port's: the harness port does not take it.
    assert _adopt(f"{url}/v1/adopt", key, request).status_code == 423
    assert _adopt(f"{op_url}/v1/adopt", "wrong", request).status_code == 401
    adopted = _adopt(f"{op_url}/v1/adopt", key, request)
    assert adopted.status_code == 200, adopted.text
    assert _adopt(f"{op_url}/v1/adopt", key, request).status_code == 409

    usage = httpx.get(f"{op_url}/v1/usage", headers={"authorization": f"Bearer {token}"}, timeout=5)
    assert usage.status_code == 200, usage.text
    assert usage.json()["budget"]["tokens"] == 5000  # the delivered budget is enforced
    assert httpx.get(f"{op_url}/v1/usage", timeout=5).status_code == 401
    # The model proxy now answers the delivered credential, and only it.
    body = {
        "model": "corral-scripted",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert httpx.post(f"{url}/v1/messages", json=body, timeout=10).status_code == 401
    model.script("c-custodian", [{"text": "ok"}])
    answered = httpx.post(
        f"{url}/v1/messages", json=body, headers={"x-api-key": credential}, timeout=30
    )
    assert answered.status_code == 200, answered.text


def _custodian_adopt(egress_credential: str | None) -> tuple[dict[str, Any], str]:
    credential = secrets.token_urlsafe(32)
    request = CustodianAdoptRequest(
        wireToken=secrets.token_urlsafe(32),
        custodianCredential=credential,
        session=AdoptedSession(name="s1", namespace="team", uid="uid-1"),
        agentName="coder",
        agent=AGENT,  # type: ignore[arg-type]
        branch="corral/s1",
        gitRemoteUrl="https://example.invalid/r.git",
        egressCredential=egress_credential,
    ).model_dump(mode="json", by_alias=True)
    return request, credential


def test_behind_the_gateway_the_adopt_hands_the_custodian_its_proxy_credential(
    tmp_path: Path, model: Model
) -> None:
    """A pooled pod's custodian knows the gateway (the pod's) but holds no proxy credential
    until the adopt delivers the Session's: its model requests then leave through the real
    gateway as the custodian's identity. An adopt without one is refused, naming why."""
    from ._gateway import binding, start_gateway, write_bindings

    egress = secrets.token_urlsafe(32)
    model_port = int(model.url.rsplit(":", 1)[1].rstrip("/"))
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 model.test\n")
    bindings = tmp_path / "bindings.json"
    rule = {"host": "model.test", "ports": [model_port], "methods": ["POST"], "private": True}
    bound = binding(
        namespace="team", session="s1", agent="coder", credential=egress, custodian_rules=[rule]
    )
    write_bindings(bindings, [("127.0.0.1", "uid-pod", bound)])
    gateway = start_gateway(
        tmp_path / "gw", ["--bindings-file", str(bindings), "--hosts-file", str(hosts)]
    )
    upstream = f"http://model.test:{model_port}"
    try:
        for given, ok in ((None, False), (egress, True)):
            state = tmp_path / ("with" if ok else "without")
            state.mkdir()
            with _pooled_custodian(state, upstream, {"CORRAL_EGRESS_PROXY": gateway.proxy_url}) as (
                url,
                op_url,
                key,
            ):
                request, credential = _custodian_adopt(given)
                adopted = _adopt(f"{op_url}/v1/adopt", key, request)
                if not ok:
                    assert adopted.status_code == 400, adopted.text
                    assert "CORRAL_EGRESS_CREDENTIAL_FILE" in adopted.json()["reason"]
                    continue
                assert adopted.status_code == 200, adopted.text
                model.script("c-egress", [{"text": "through the gateway"}])
                body = {
                    "model": "corral-scripted",
                    "max_tokens": 64,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                answered = httpx.post(
                    f"{url}/v1/messages", json=body, headers={"x-api-key": credential}, timeout=30
                )
                assert answered.status_code == 200, answered.text
        decisions = [d for d in gateway.decisions() if d.get("host") == "model.test"]
        assert decisions and all(d["decision"] == "allowed" for d in decisions), decisions
        assert {d["identity"] for d in decisions} == {"custodian"}
        # The credential never reaches a log in clear.
        for log in tmp_path.rglob("custodian.log"):
            assert egress not in log.read_text()
        assert (
            json.dumps(egress)[1:-1]
            not in (tmp_path / "gw").joinpath(f"gateway-{gateway.proxy_port}.out").read_text()
        )
    finally:
        gateway.stop()
