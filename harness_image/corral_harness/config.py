"""The harness's settings, read from the environment once at start (docs/operations.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    pass


# The engine adapters CORRAL_ENGINE may name (engine/choice.py maps each to its module).
ENGINES = ("lean", "sdk")


def _float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must not be negative")
    return value


def _flag(env: dict[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")


@dataclass(frozen=True)
class HarnessConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    state_dir: Path = Path(".corral/harness-state")
    granted_root: Path = Path("/workspace")
    # The tools container's exec service; unset, the harness runs the working tools itself.
    exec_socket: Path | None = None
    token_file: Path | None = None
    custodian_url: str | None = None
    # The pod-local credential the harness presents to the custodian (never to the agent).
    custodian_credential_file: Path | None = None
    read_only: bool = False
    model_base_url: str | None = None
    # Waits and caps; the defaults are the design's, tests shorten them.
    pick_sweep_seconds: float = 10.0
    stream_idle_seconds: float = 120.0
    stream_cap_seconds: float = 300.0
    retry_backoff_seconds: float = 1.0
    model_retries: int = 2
    bash_timeout_seconds: float = 120.0
    durable: bool = True  # fsync every record of the conversation log
    engine: str = "lean"  # CORRAL_ENGINE: `lean` (httpx) or `sdk` (the official SDK)
    # CORRAL_CACHE_BREAKPOINTS: mark stable prefixes for the prompt cache (0: the bench's "without")
    cache_breakpoints: bool = True

    def custodian_credential(self) -> str | None:
        """The credential's text, read once at start; an empty file is a configuration error."""
        if self.custodian_credential_file is None:
            return None
        text = self.custodian_credential_file.read_text().strip()
        if not text:
            raise ConfigError(
                f"the custodian credential file {self.custodian_credential_file} is empty"
            )
        return text

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> HarnessConfig:
        env = dict(os.environ if env is None else env)
        addr = env.get("CORRAL_HARNESS_ADDR", "0.0.0.0:8080")
        host, sep, port_text = addr.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ConfigError(f"CORRAL_HARNESS_ADDR must be host:port, got {addr!r}")
        root = Path(env.get("CORRAL_GRANTED_ROOT", "/workspace"))
        exec_socket = env.get("CORRAL_EXEC_SOCKET") or None
        # With an exec service the workspace is the tools container's: the harness does not
        # mount it, so the root is checked there (the service refuses to start without it).
        if exec_socket is None and not root.is_dir():
            raise ConfigError(f"CORRAL_GRANTED_ROOT {str(root)!r} is not a directory")
        if exec_socket is not None and not root.is_absolute():
            raise ConfigError(
                f"CORRAL_GRANTED_ROOT {str(root)!r} must be absolute with CORRAL_EXEC_SOCKET"
            )
        engine = env.get("CORRAL_ENGINE") or "lean"
        if engine not in ENGINES:
            raise ConfigError(f"CORRAL_ENGINE must be one of {', '.join(ENGINES)}, got {engine!r}")
        token = env.get("CORRAL_WIRE_TOKEN_FILE") or None
        custodian = (env.get("CORRAL_CUSTODIAN_URL") or "").rstrip("/") or None
        return cls(
            host=host.strip("[]") or "0.0.0.0",
            port=int(port_text),
            state_dir=Path(env.get("CORRAL_STATE_DIR") or ".corral/harness-state"),
            granted_root=root,
            exec_socket=Path(exec_socket) if exec_socket else None,
            token_file=Path(token) if token else None,
            custodian_url=custodian,
            custodian_credential_file=Path(cred)
            if (cred := env.get("CORRAL_CUSTODIAN_CREDENTIAL_FILE"))
            else None,
            read_only=_flag(env, "CORRAL_READ_ONLY", False),
            model_base_url=env.get("ANTHROPIC_BASE_URL") or None,
            pick_sweep_seconds=_float(env, "CORRAL_PICK_SWEEP_SECONDS", 10.0),
            stream_idle_seconds=_float(env, "CORRAL_STREAM_IDLE_SECONDS", 120.0),
            stream_cap_seconds=_float(env, "CORRAL_STREAM_CAP_SECONDS", 300.0),
            retry_backoff_seconds=_float(env, "CORRAL_RETRY_BACKOFF_SECONDS", 1.0),
            model_retries=int(_float(env, "CORRAL_MODEL_RETRIES", 2)),
            bash_timeout_seconds=_float(env, "CORRAL_BASH_TIMEOUT_SECONDS", 120.0),
            durable=_flag(env, "CORRAL_DURABLE", True),
            engine=engine,
            cache_breakpoints=_flag(env, "CORRAL_CACHE_BREAKPOINTS", True),
        )
