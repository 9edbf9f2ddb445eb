"""What a step no longer recomputes (docs/performance.md, "Steps on a real repository"): each
shortcut must give exactly what the full computation gives, and follow every change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral_harness.context.assembly import Unit, trim_layer
from corral_harness.context.layers import LayerName, Strategy
from corral_harness.context.tokenizer import DEFAULT_TOKENIZER, ByteEstimateTokenizer
from corral_harness.engine.lean_engine import encode_request
from corral_harness.policy.turn_policy import CorralTurnPolicy


def test_a_request_body_is_byte_for_byte_json_dumps_with_its_reused_parts() -> None:
    tools = [{"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}}]
    params: dict[str, Any] = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": 'héllo "quoted" \u2028'}],
        "system": "<instruction_files>\n[AGENTS.md]\nbe brief ✓\n</instruction_files>",
        "tools": tools,
        "stream": True,
    }
    assert encode_request(params) == json.dumps(params).encode()
    # The next step: a new message, equal system and tools (new objects) reuse their JSON.
    step = {**params, "messages": [*params["messages"], {"role": "assistant", "content": "ok"}]}
    step["system"] = "".join(list(str(params["system"])))
    step["tools"] = [dict(tools[0])]
    assert encode_request(step) == json.dumps(step).encode()
    # A changed system prompt or tool list is encoded afresh, never served from the last one.
    changed = {**step, "system": "another prompt", "tools": [{**tools[0], "name": "read"}]}
    assert encode_request(changed) == json.dumps(changed).encode()
    without = {k: v for k, v in changed.items() if k not in ("system", "tools")}
    assert encode_request(without) == json.dumps(without).encode()


def test_the_same_units_tuple_is_trimmed_once_and_a_new_one_again() -> None:
    units = tuple(Unit(f"d{i}/AGENTS.md", "x" * 40) for i in range(3))

    def trim(of: tuple[Unit, ...] | list[Unit], budget: int) -> tuple[list[str], list[str]]:
        report, kept = trim_layer(
            LayerName.INSTRUCTION_FILES, of, budget, Strategy.DROP_WHOLE_UNITS, DEFAULT_TOKENIZER
        )
        return [u.source for u in kept], report.dropped

    assert trim(units, 1000) == (["d0/AGENTS.md", "d1/AGENTS.md", "d2/AGENTS.md"], [])
    assert trim(units, 1000) == (["d0/AGENTS.md", "d1/AGENTS.md", "d2/AGENTS.md"], [])
    # The same tuple under another budget, or with another tokenizer, is trimmed again.
    assert trim(units, 25) == (["d2/AGENTS.md"], ["d0/AGENTS.md", "d1/AGENTS.md"])
    report, _ = trim_layer(
        LayerName.INSTRUCTION_FILES, units, 25, Strategy.DROP_WHOLE_UNITS, ByteEstimateTokenizer()
    )
    assert report.kept == ["d2/AGENTS.md"]
    # Another tuple (one text changed) is not taken for the last one.
    changed = (*units[:2], Unit("d2/AGENTS.md", "y" * 90))
    report, kept = trim_layer(
        LayerName.INSTRUCTION_FILES, changed, 1000, Strategy.DROP_WHOLE_UNITS, DEFAULT_TOKENIZER
    )
    assert "y" * 90 in report.text and kept[-1].text == "y" * 90
    assert trim(units, 1000) == (["d0/AGENTS.md", "d1/AGENTS.md", "d2/AGENTS.md"], [])


def test_the_instruction_layer_is_built_again_only_when_its_files_or_instructions_change(
    tmp_path: Path,
) -> None:
    (tmp_path / "AGENTS.md").write_text("Run make test.")
    policy = CorralTurnPolicy(granted_root=tmp_path)
    files = policy.cache.load(tmp_path)
    first = policy._instruction_layer(files, "Be brief.")
    assert [u.source for u in first][-1] != "AGENTS.md" and "Run make test." in first[0].text
    assert policy._instruction_layer(files, "Be brief.") is first  # unchanged: the same units
    other = policy._instruction_layer(files, "Be thorough.")
    assert other is not first and other[-1].text == "Be thorough."
    (tmp_path / "AGENTS.md").write_text("Run make check.")
    policy.cache.invalidate()
    rescanned = policy.cache.load(tmp_path)
    assert rescanned is not files
    assert "Run make check." in policy._instruction_layer(rescanned, "Be thorough.")[0].text
