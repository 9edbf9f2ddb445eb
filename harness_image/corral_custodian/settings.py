"""The custodian's configuration, read from its environment (see `corral-custodian --help`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from corral_api.kinds import AgentSpec

from .budget import Budget

DEFAULT_ADDR = "127.0.0.1:8081"
DEFAULT_UPSTREAM = "https://api.anthropic.com"


class SettingsError(ValueError):
    """The environment does not describe a custodian that can start."""


@dataclass(frozen=True)
class KubeSettings:
    api: str
    token_file: Path
    ca_file: Path | None


@dataclass(frozen=True)
class CustodianSettings:
    host: str
    port: int
    upstream_url: str
    model_key: str | None
    session_name: str
    session_namespace: str
    session_uid: str
    budget: Budget
    state_dir: Path | None
    agent_spec_file: Path | None
    agent_spec_json: str | None
    kube: KubeSettings | None
    git_credentials_file: Path | None
    session_branch: str | None
    workspace: Path | None
    git_remote_url: str | None
    land_check: str | None
    read_only: bool

    def load_agent(self) -> AgentSpec:
        """The Agent spec, read afresh each call: a mounted file may change between turns."""
        if self.agent_spec_file is not None:
            try:
                text = self.agent_spec_file.read_text()
            except OSError as e:
                raise SettingsError(f"cannot read CORRAL_AGENT_SPEC_FILE: {e}") from e
            return parse_agent_spec(text, "CORRAL_AGENT_SPEC_FILE")
        if self.agent_spec_json is not None:
            return parse_agent_spec(self.agent_spec_json, "CORRAL_AGENT_SPEC_JSON")
        # No Agent given: a plain leaf agent, so no control tool beyond push is offered.
        return AgentSpec(identity="(no agent spec)", model="unknown")


def parse_agent_spec(text: str, source: str) -> AgentSpec:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SettingsError(f"{source} is not JSON or YAML: {e}") from e
    if isinstance(data, dict) and data.get("kind") == "Agent":
        data = data.get("spec")
    if not isinstance(data, dict):
        raise SettingsError(f"{source} must hold an Agent spec object")
    try:
        return AgentSpec.model_validate(data)
    except ValueError as e:
        raise SettingsError(f"{source} is not a valid Agent spec: {e}") from e


def _split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingsError(f"CORRAL_CUSTODIAN_ADDR must be host:port, not {addr!r}")
    return host.strip("[]"), int(port)


def _number(env: Mapping[str, str], name: str, kind: type[int] | type[float]) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return kind(0)
    try:
        value = kind(raw)
    except ValueError as e:
        raise SettingsError(f"{name} must be a number, not {raw!r}") from e
    if value < 0:
        raise SettingsError(f"{name} cannot be negative")
    return value


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


def from_env(env: Mapping[str, str]) -> CustodianSettings:
    host, port = _split_addr(env.get("CORRAL_CUSTODIAN_ADDR", DEFAULT_ADDR))
    key = env.get("ANTHROPIC_API_KEY") or None
    key_file = _path(env, "CORRAL_MODEL_KEY_FILE")
    if key is None and key_file is not None:
        try:
            key = key_file.read_text().strip() or None
        except OSError as e:
            raise SettingsError(f"cannot read CORRAL_MODEL_KEY_FILE: {e}") from e
    kube: KubeSettings | None = None
    api = env.get("CORRAL_KUBE_API", "").strip()
    if api:
        token_file = _path(env, "CORRAL_KUBE_TOKEN_FILE")
        if token_file is None:
            raise SettingsError("CORRAL_KUBE_API is set but CORRAL_KUBE_TOKEN_FILE is not")
        kube = KubeSettings(api.rstrip("/"), token_file, _path(env, "CORRAL_KUBE_CA_FILE"))
    spec_json = env.get("CORRAL_AGENT_SPEC_JSON") or None
    settings = CustodianSettings(
        host=host,
        port=port,
        upstream_url=env.get("CORRAL_UPSTREAM_URL", DEFAULT_UPSTREAM).rstrip("/"),
        model_key=key,
        session_name=env.get("CORRAL_SESSION_NAME", "local"),
        session_namespace=env.get("CORRAL_SESSION_NAMESPACE", "default"),
        session_uid=env.get("CORRAL_SESSION_UID", ""),
        budget=Budget(
            tokens=_number(env, "CORRAL_BUDGET_TOKENS", int),
            cost=_number(env, "CORRAL_BUDGET_COST", float),
        ),
        state_dir=_path(env, "CORRAL_STATE_DIR"),
        agent_spec_file=_path(env, "CORRAL_AGENT_SPEC_FILE"),
        agent_spec_json=spec_json,
        kube=kube,
        git_credentials_file=_path(env, "CORRAL_GIT_CREDENTIALS_FILE"),
        session_branch=env.get("CORRAL_SESSION_BRANCH", "").strip() or None,
        workspace=_path(env, "CORRAL_WORKSPACE"),
        git_remote_url=env.get("CORRAL_GIT_REMOTE_URL", "").strip() or None,
        land_check=env.get("CORRAL_LAND_CHECK", "").strip() or None,
        read_only=env.get("CORRAL_READ_ONLY", "").strip().lower() in ("1", "true", "yes"),
    )
    settings.load_agent()  # fail at start, not at the first turn, on a bad spec
    if kube is not None and not settings.session_uid:
        raise SettingsError("CORRAL_SESSION_UID is required when a cluster is configured")
    return settings
