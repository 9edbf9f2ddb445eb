"""`corral run`'s egress: the Agent's `sandbox.egress` through a local corral-gateway process
(docs/egress.md, "corral run").

The run's processes share this machine's address, so the gateway binds 127.0.0.1 to the run:
the custodian's requests carry the run's proxy credential and reach the model upstream and the
git remote; the agent's commands (the harness's children) get the proxy variables without it and
reach the Agent's rules alone. Without root there is no network namespace: a command that
ignores the proxy variables, or that asks DNS, is not stopped. The docs say so, and so does the
run's note.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from corral_api.kinds import Agent
from corral_operator.builders import egress
from corral_operator.naming import ANNOTATION_EGRESS_BINDING

from ._processes import free_port

GATEWAY_ENV = "CORRAL_GATEWAY_BINARY"
NO_PROXY = "localhost,127.0.0.1,::1"


class LocalGatewayError(Exception):
    """The local gateway did not start."""


def find_gateway(environ: dict[str, str] | None = None) -> Path | None:
    """corral-gateway: $CORRAL_GATEWAY_BINARY, else on PATH, else the newest `make gateway`
    build under ~/.cache/corral/gateway."""
    env = os.environ if environ is None else environ
    if env.get(GATEWAY_ENV):
        path = Path(env[GATEWAY_ENV])
        return path if path.is_file() else None
    found = shutil.which("corral-gateway")
    if found:
        return Path(found)
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corral" / "gateway"
    builds = sorted(cache.glob("*/corral-gateway"), key=lambda p: p.stat().st_mtime)
    return builds[-1] if builds else None


def run_binding(
    agent: Agent,
    name: str,
    upstream: str | Sequence[str],
    repo: str | None,
    credential: str,
    collector: str | None = None,
) -> dict[str, Any]:
    """The binding of this run, as the operator would write it on a sandbox pod; `upstream` is
    the model's endpoint, or a provider's endpoints (docs/providers.md)."""
    urls = [upstream] if isinstance(upstream, str) else list(upstream)
    custodian = [egress.url_rule(url, private=True) for url in urls]
    if collector:  # the trace collector the custodian relays the harness's spans to
        custodian.append(egress.url_rule(collector, private=True))
    if repo and "://" in repo:
        custodian.append(egress.url_rule(repo, private=False))
    annotation = egress.binding(
        namespace="local",
        pod=name,
        session=name,
        agent=str(agent.metadata.get("name") or "agent"),
        credential=credential,
        agent_rules=[egress.rule_of(r) for r in agent.spec.sandbox.egress],
        custodian=[r for r in custodian if r is not None],
    )
    value: dict[str, Any] = json.loads(annotation[ANNOTATION_EGRESS_BINDING])
    return value


@dataclass
class LocalGateway:
    process: subprocess.Popen[bytes]
    proxy_url: str
    admin_url: str
    credential_file: Path

    def tools_env(self) -> dict[str, str]:
        """What the harness (and so every command the agent runs) is given: no credential."""
        env = {}
        for name in ("HTTPS_PROXY", "HTTP_PROXY"):
            env[name] = env[name.lower()] = self.proxy_url
        env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
        return env

    def custodian_env(self) -> dict[str, str]:
        return {
            "CORRAL_EGRESS_PROXY": self.proxy_url,
            "CORRAL_EGRESS_CREDENTIAL_FILE": str(self.credential_file),
        }

    def records(self, name: str) -> dict[str, Any] | None:
        """This run's decisions, as the gateway recorded them; None when unreadable."""
        try:
            answer = httpx.get(
                f"{self.admin_url}/v1/egress",
                params={"namespace": "local", "session": name},
                timeout=5,
                trust_env=False,
            )
        except httpx.HTTPError:
            return None
        if answer.status_code != 200:
            return None
        body = answer.json()
        return body if isinstance(body, dict) else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """No more grace (a Ctrl-C while the run stops): `stop` then finds it gone."""
        if self.process.poll() is None:
            self.process.kill()


def start_local_gateway(
    binary: Path,
    state_dir: Path,
    agent: Agent,
    name: str,
    upstream: str | Sequence[str],
    repo: str | None,
    *,
    collector: str | None = None,
    ready_timeout: float = 20.0,
) -> LocalGateway:
    """Start the gateway with this run's binding; LocalGatewayError with its log's end."""
    secrets_dir = state_dir / "secrets"
    secrets_dir.mkdir(parents=True, exist_ok=True)
    credential = secrets.token_urlsafe(32)
    credential_file = secrets_dir / "egress-credential"
    credential_file.write_text(credential + "\n")
    credential_file.chmod(0o600)
    bindings = state_dir / "egress-bindings.json"
    binding = run_binding(agent, name, upstream, repo, credential, collector)
    entry = {"ip": "127.0.0.1", "uid": f"local-{name}", "binding": binding}
    bindings.write_text(json.dumps([entry]))
    proxy_port, admin_port = free_port(), free_port()
    log = state_dir / "logs" / "gateway.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                str(binary),
                "--listen",
                f"127.0.0.1:{proxy_port}",
                "--admin",
                f"127.0.0.1:{admin_port}",
                "--bindings-file",
                str(bindings),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    gateway = LocalGateway(
        process,
        f"http://127.0.0.1:{proxy_port}",
        f"http://127.0.0.1:{admin_port}",
        credential_file,
    )
    deadline = time.monotonic() + ready_timeout
    while True:
        if process.poll() is not None:
            raise LocalGatewayError(
                f"corral-gateway exited with {process.returncode}: "
                f"{log.read_text(errors='replace')[-1500:]}"
            )
        try:
            ready = httpx.get(f"{gateway.admin_url}/readyz", timeout=1, trust_env=False)
            if ready.status_code == 200:
                return gateway
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            gateway.stop()
            raise LocalGatewayError(f"corral-gateway not ready after {ready_timeout:.0f} s")
        time.sleep(0.05)
