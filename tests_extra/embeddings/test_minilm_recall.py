"""The `memory-embeddings` extra (docs/memory.md, ADR 0073): MiniLM recall finds facts by
meaning where lexical recall finds nothing, over 1,000 facts, loads with no network at all,
and is what a real custodian uses when CORRAL_MEMORY_EMBEDDER=minilm.

Run by `make test-embeddings`, in its own venv; the default `pytest` run (testpaths = tests)
never collects this directory."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.unit.custodian._custodian_proc import running_custodian

from corral_common.memory import HashedLexicalEmbedder, MemoryStore, MiniLMEmbedder

pytestmark = pytest.mark.timeout(600)

# A fact and a question that means it while sharing no content word with it.
PARAPHRASES = [
    ("staging", "The staging database is reset every Sunday night.", "When is the test DB wiped?"),
    ("parking", "Use the automobile entrance on the north side.", "Where do cars get in?"),
    (
        "oncall",
        "Page the on-call engineer through the incident channel.",
        "How do I reach whoever is on duty during an outage?",
    ),
    (
        "laptops",
        "Lost laptops must be reported to security within an hour.",
        "I misplaced my notebook computer, who do I tell?",
    ),
    ("kitchen", "The coffee machine on floor three is broken.", "Where can I get an espresso?"),
    ("invoices", "Invoices are paid within thirty days.", "How long until a bill is settled?"),
]
MODULES = ["parser", "scheduler", "exporter", "renderer", "indexer", "uploader", "linter", "router"]
TEMPLATES = [
    "The {m} module keeps its config in {f}.",
    "Run the {m} tests with {t} before merging.",
    "The {m} owner is {p}.",
    "{p} wrote the first version of the {m} in {y}.",
    "The {m} logs go to {f}.",
    "Bump the {m} version when its schema changes.",
    "The {m} uses {l} for its core loop.",
    "Never call the {m} from a signal handler.",
]
FILL = {
    "f": ["settings.toml", "config.yaml", "/etc/app.ini", ".env"],
    "t": ["pytest -x", "make check", "tox", "nox"],
    "p": ["Ana", "Bo", "Chen", "Dara", "Eli"],
    "y": ["2019", "2021", "2023"],
    "l": ["asyncio", "threads", "a state machine", "a priority heap"],
}


def distractors(count: int) -> list[tuple[str, str]]:
    """Project-like facts about other things, deterministic."""
    rnd = random.Random(7)
    found: set[tuple[str, str]] = set()
    while len(found) < count:
        module = rnd.choice(MODULES)
        words = {k: rnd.choice(v) for k, v in FILL.items()}
        text = rnd.choice(TEMPLATES).format(m=module, **words) + f" (#{rnd.randint(1, 999)})"
        found.add((module, text))
    return sorted(found)


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def filled(store: MemoryStore) -> dict[str, int]:
    for subject, text in distractors(1000 - len(PARAPHRASES)):
        store.add(subject, text)
    return {text: store.add(subject, text) for subject, text, _ in PARAPHRASES}


def test_minilm_finds_paraphrases_that_lexical_recall_misses(
    tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    lexical = MemoryStore(tmp_path / "lexical.db", "team/a", embedder=HashedLexicalEmbedder())
    semantic = MemoryStore(tmp_path / "minilm.db", "team/a", embedder=minilm)
    filled(lexical)
    started = time.perf_counter()
    ids = filled(semantic)
    write_s = time.perf_counter() - started
    latencies = []
    for _, text, question in PARAPHRASES:
        assert all(r.fact.text != text for r in lexical.recall(question)), question
        started = time.perf_counter()
        recalled = semantic.recall(question)
        latencies.append(time.perf_counter() - started)
        assert recalled, question
        assert (recalled[0].fact.id, recalled[0].via) == (ids[text], "text"), (question, recalled)
        assert recalled[0].score >= minilm.recall_threshold
    print(
        f"\nminilm over 1000 facts: write {write_s:.1f} s ({write_s:.1f} ms per fact), "
        f"recall median {statistics.median(latencies) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    # The figures in docs/memory.md; the bound only catches a gross regression.
    assert statistics.median(latencies) < 2.0


def test_unrelated_questions_recall_nothing(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    store = MemoryStore(tmp_path / "m.db", "team/a", embedder=minilm)
    for subject, text, _ in PARAPHRASES:
        store.add(subject, text)
    assert store.recall("What is the capital of Mongolia?") == []


LOAD_OFFLINE = """
import socket
from corral_common.memory import MiniLMEmbedder
# This namespace has no network: not even loopback is up, so nothing could be downloaded.
try:
    socket.create_connection(("198.18.0.1", 9), timeout=1)
except OSError as e:
    print("connect refused:", e.errno)
else:
    raise SystemExit("this process can reach a network")
e = MiniLMEmbedder()
print(e.name, len(e.embed("where do cars get in?")))
"""


def test_the_model_loads_in_a_namespace_without_network(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["HOME"] = str(tmp_path)  # no Hugging Face cache from earlier runs to fall back on
    started = time.perf_counter()
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", LOAD_OFFLINE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert "connect refused" in done.stdout
    assert "minilm-l6-v2 384" in done.stdout
    print(f"\nimport + load + first embedding with no network: {took:.1f} s")


def test_a_custodian_recalls_by_meaning_when_configured(tmp_path: Path) -> None:
    agent = {
        "identity": "You are a test agent.",
        "model": "corral-scripted",
        "tools": {"allow": ["mcp__corral__memory_*"]},
        "memory": {"scope": "team"},
    }
    env = {
        "CORRAL_SESSION_NAME": "s1",
        "CORRAL_SESSION_NAMESPACE": "ns",
        "CORRAL_AGENT_NAME": "helper",
        "CORRAL_AGENT_SPEC_JSON": json.dumps(agent),
        "CORRAL_MEMORY_SQLITE": str(tmp_path / "memory.db"),
        "HOME": str(tmp_path),
    }
    question = "Where do cars get in?"
    minilm_env = env | {"CORRAL_MEMORY_EMBEDDER": "minilm"}
    with (
        running_custodian(
            minilm_env, tmp_path / "minilm.log", operator=False, ready_timeout=120
        ) as custodian,
        custodian.client() as client,
    ):
        added = client.post(
            "/agents/conv/tools/memory_add",
            json={"subject": "parking", "text": "Use the automobile entrance on the north side."},
            headers={"X-Corral-Submission": "sub-1"},
        )
        assert added.status_code == 200, added.text
        recalled = client.post("/memory/recall", json={"query": question})
        assert recalled.status_code == 200, recalled.text
        facts = recalled.json()["facts"]
        assert [(f["subject"], f["via"]) for f in facts] == [("parking", "text")]
    # The same store through the default embedder: the question shares no word with the fact.
    with (
        running_custodian(env, tmp_path / "lexical.log", operator=False) as custodian,
        custodian.client() as client,
    ):
        recalled = client.post("/memory/recall", json={"query": question})
        assert recalled.status_code == 200, recalled.text
        assert recalled.json()["facts"] == []
