"""The test-side client of the scripted model server (corral_dev.scripted): load a script,
read what it received, and the tool results the agent saw (over HTTP: the cluster, attack and
node tiers); and a server in the test's own process (ScriptedServer: the unit and wire tiers,
through the `scripted` fixture of tests/_fixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from corral_dev.scripted import Script, ScriptedModel, parse_script, serve_in_thread


def load_script(model_url: str, script: dict[str, Any]) -> None:
    httpx.post(f"{model_url}/_script", json=script, timeout=10).raise_for_status()


def model_requests(model_url: str, conversation: str) -> list[dict[str, Any]]:
    found = httpx.get(f"{model_url}/_requests", params={"conversation": conversation}, timeout=10)
    found.raise_for_status()
    body = found.json()
    return list(body["requests"] if isinstance(body, dict) else body)


def tool_results(requests: list[dict[str, Any]]) -> list[str]:
    """The tool results the model received, in order, from its last request."""
    out: list[str] = []
    for message in requests[-1]["body"]["messages"]:
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = "".join(str(c.get("text", "")) for c in content)
                out.append(str(content))
    return out


def unmarked(value: Any) -> Any:
    """`value` without the prompt-cache markers (`cache_control`) a request carries: what the
    transcript holds, for comparing a request with it."""
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    return value


def marked_paths(body: dict[str, Any]) -> list[str]:
    """Where a request carries prompt-cache markers, as paths (`tools[5]`, `system[0]`,
    `messages[2].content[0]`), in the order the provider reads them."""
    found = [f"tools[{i}]" for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    system = body.get("system")
    blocks = system if isinstance(system, list) else []
    found += [f"system[{i}]" for i, b in enumerate(blocks) if "cache_control" in b]
    for m, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        for b, block in enumerate(content if isinstance(content, list) else []):
            if "cache_control" in block:
                found.append(f"messages[{m}].content[{b}]")
    return found


def system_text(body: dict[str, Any]) -> str:
    """A request's system prompt as one text: the harness sends it as text blocks (its stable
    parts marked for the prompt cache), joined here as the harness splits it."""
    system = body.get("system") or ""
    if isinstance(system, list):
        return "\n\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return str(system)


@dataclass(frozen=True)
class ScriptedServer:
    """The scripted model served on loopback from this process: its address, the model behind
    it, and what it received."""

    url: str
    model: ScriptedModel

    def load(self, script: dict[str, Any]) -> None:
        """Add `script`'s conversations (and its default) to what the model replies."""
        self.model.set_script(parse_script(script))

    def requests(self, conversation: str | None = None) -> list[dict[str, Any]]:
        """The requests the model received, in order: all of them, or one conversation's."""
        found = self.model.requests
        return [r for r in found if conversation is None or r["conversation"] == conversation]

    def reset(self) -> None:
        """As a new model: no script, no replies given, no requests, nothing cached."""
        self.model.set_script(Script(), merge=False)
        self.model.requests.clear()
        self.model.cache.clear()


@contextmanager
def serving_scripted() -> Iterator[ScriptedServer]:
    """A scripted model server on a free loopback port, stopped on exit."""
    running = serve_in_thread(ScriptedModel())
    try:
        yield ScriptedServer(running.url, running.model)
    finally:
        running.stop()
