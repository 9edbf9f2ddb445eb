"""The model catalog as data: the shipped file, the platform's overlay, and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral_common import catalog
from corral_common.catalog import (
    CATALOG_ENV,
    CatalogError,
    UnknownModel,
    clamp_output_tokens,
    load_catalog,
    models,
    resolve_model,
)

ACME: dict[str, Any] = {
    "name": "acme-coder-1",
    "contextWindow": 128_000,
    "maxOutputTokens": 16_000,
    "thinking": False,
    "prices": {"input": 2, "output": 8, "cacheRead": 0.2, "cacheWrite": 2.5},
}


def _overlay(tmp_path: Path, entries: list[dict[str, Any]], name: str = "models.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"models": entries}))
    return path


def test_the_shipped_catalog_has_the_current_claude_models_and_the_scripted_one() -> None:
    shipped = load_catalog()
    for name in ("claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1"):
        assert name in shipped
    opus = shipped["claude-opus-4-5"]
    assert (opus.context_window, opus.max_output_tokens) == (200_000, 64_000)
    assert (opus.input_per_mtok, opus.output_per_mtok) == (5.0, 25.0)
    assert (opus.cache_read_per_mtok, opus.cache_write_per_mtok) == (0.5, 6.25)
    assert not shipped["claude-3-5-haiku-latest"].thinking
    # A dated id is an alias that keeps its own name (the custodian allowlists what is sent).
    dated = shipped["claude-sonnet-4-5-20250929"]
    assert dated.name == "claude-sonnet-4-5-20250929" and dated.input_per_mtok == 3.0
    assert shipped["corral-scripted"].input_per_mtok == 0


def test_an_overlay_adds_a_model_and_overrides_only_the_fields_it_names(tmp_path: Path) -> None:
    override = {"name": "claude-sonnet-4-5", "prices": {"input": 2.7}}
    merged = load_catalog(_overlay(tmp_path, [ACME, override]))
    acme = merged["acme-coder-1"]
    assert (acme.context_window, acme.max_output_tokens, acme.thinking) == (128_000, 16_000, False)
    assert clamp_output_tokens(acme, None) == 16_000
    sonnet = merged["claude-sonnet-4-5"]
    assert sonnet.input_per_mtok == 2.7  # changed
    assert (sonnet.output_per_mtok, sonnet.context_window) == (15.0, 200_000)  # kept
    assert "claude-opus-4-5" in merged  # the rest of the shipped catalog stays


def test_a_yaml_overlay_and_an_empty_overlay_are_accepted(tmp_path: Path) -> None:
    yaml_file = tmp_path / "models.yaml"
    yaml_file.write_text(
        "models:\n  - name: acme-coder-1\n    contextWindow: 128000\n    maxOutputTokens: 16000\n"
        "    prices: {input: 2, output: 8, cacheRead: 0.2, cacheWrite: 2.5}\n"
    )
    assert "acme-coder-1" in load_catalog(yaml_file)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"models": []}))
    assert load_catalog(empty).keys() == load_catalog().keys()


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([{"name": "acme-coder-1", "contextWindow": 128_000}], "maxOutputTokens: Field required"),
        ([{**ACME, "contextWindow": 10}], "contextWindow: Input should be greater than or equal"),
        ([{**ACME, "prices": {**ACME["prices"], "input": -1}}], "prices.input: Input should be"),
        ([{**ACME, "window": 1}], "window: Extra inputs are not permitted"),
        ([{**ACME, "name": "bad name!"}], "name: String should match pattern"),
        ([{"contextWindow": 1}], "models[0]: needs a 'name'"),
    ],
)
def test_a_bad_overlay_entry_is_refused_naming_the_file_the_entry_and_the_field(
    tmp_path: Path, entries: list[dict[str, Any]], expected: str
) -> None:
    overlay = _overlay(tmp_path, entries)
    with pytest.raises(CatalogError) as raised:
        load_catalog(overlay)
    message = str(raised.value)
    assert str(overlay) in message and expected in message


def test_an_unreadable_or_malformed_overlay_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot be read"):
        load_catalog(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"models": [')
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_catalog(broken)
    wrong_shape = tmp_path / "list.json"
    wrong_shape.write_text("[1, 2]")
    with pytest.raises(CatalogError, match="Input should be a valid dictionary"):
        load_catalog(wrong_shape)


def test_the_process_catalog_reads_the_overlay_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CATALOG_ENV, str(_overlay(tmp_path, [ACME])))
    models.cache_clear()
    try:
        assert resolve_model("acme-coder-1").context_window == 128_000
        with pytest.raises(UnknownModel) as unknown:
            resolve_model("gpt-4")
        assert "acme-coder-1" in str(unknown.value) and "claude-opus-4-5" in str(unknown.value)
    finally:
        models.cache_clear()
    monkeypatch.delenv(CATALOG_ENV)
    assert "acme-coder-1" not in models()


def test_loading_the_catalog_is_lazy_and_cheap() -> None:
    """Importing the module reads no file; the first lookup does, once, in milliseconds."""
    probe = (
        "import time, corral_common.catalog as c\n"
        "assert c.models.cache_info().currsize == 0\n"
        "t = time.perf_counter(); c.models(); print(time.perf_counter() - t)\n"
        "import sys; print('yaml' in sys.modules, 'jsonschema' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={}
    )
    seconds, heavy = done.stdout.splitlines()
    assert float(seconds) < 0.05, seconds
    assert heavy == "False False"  # a JSON catalog pulls in neither YAML nor jsonschema
    assert catalog.SHIPPED_CATALOG.is_file()


def test_the_example_configmap_is_a_valid_overlay(tmp_path: Path) -> None:
    import yaml

    example = (
        Path(__file__).resolve().parents[3] / "examples" / "admin" / "model-catalog-configmap.yaml"
    )
    overlay = tmp_path / "models.json"
    overlay.write_text(yaml.safe_load(example.read_text())["data"]["models.json"])
    merged = load_catalog(overlay)
    assert merged["acme-coder-1"].max_output_tokens == 16_000
    assert merged["claude-sonnet-4-5"].output_per_mtok == 13.5
