"""Long-term memory: scoped facts, links, ranking, threshold, fail-open recall, pruning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_harness.memory import (
    HashedLexicalEmbedder,
    MemoryInputError,
    MemoryStore,
    cosine,
    prune_turn_records,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    s = MemoryStore(tmp_path / "memory.db", scope="team-a/session-1")
    yield s
    s.close()


def test_add_rewrite_delete_and_link(store: MemoryStore) -> None:
    fid = store.add("billing service", "Billing runs on port 8443.")
    store.rewrite(fid, "Billing runs on port 9443.")
    assert [f.text for f in store.facts()] == ["Billing runs on port 9443."]
    other = store.add("ledger", "The ledger is append-only.")
    store.link("billing service", "ledger")
    store.delete(other)
    assert [f.id for f in store.facts()] == [fid]
    with pytest.raises(MemoryInputError, match="no fact"):
        store.delete(other)
    with pytest.raises(MemoryInputError, match="two different subjects"):
        store.link("ledger", "Ledger")
    with pytest.raises(MemoryInputError, match="subject"):
        store.add("  ", "x")


def test_scopes_do_not_see_each_other(tmp_path: Path) -> None:
    a = MemoryStore(tmp_path / "m.db", scope="a")
    b = MemoryStore(tmp_path / "m.db", scope="b")
    fid = a.add("deploy", "Deploys go through the release branch.")
    assert b.facts() == [] and b.recall("how do I deploy") == []
    with pytest.raises(MemoryInputError):
        b.delete(fid)
    assert [h.fact.id for h in a.recall("how do I deploy")] == [fid]
    with pytest.raises(MemoryInputError, match="scope is required"):
        MemoryStore(tmp_path / "m.db", scope="")


def test_ranking_exact_subject_then_linked_then_text(store: MemoryStore) -> None:
    text_hit = store.add("ci", "Flaky integration tests in the payments suite are retried twice.")
    linked = store.add("stripe", "Stripe webhooks are verified with a signing key.")
    exact = store.add("payments", "Payments owns the checkout API.")
    store.add("gardening", "Tomatoes need sun.")
    store.link("payments", "stripe")
    hits = store.recall("the payments integration tests are flaky again")
    assert [(h.fact.id, h.via) for h in hits] == [
        (exact, "subject"),
        (linked, "link"),
        (text_hit, "text"),
    ]


def test_text_only_hits_must_pass_the_threshold(tmp_path: Path) -> None:
    strict = MemoryStore(tmp_path / "m.db", scope="s", threshold=0.99)
    strict.add("ci", "Flaky integration tests are retried twice.")
    assert strict.recall("flaky integration tests") == []
    loose = MemoryStore(tmp_path / "m.db", scope="s", threshold=0.1)
    assert [h.via for h in loose.recall("flaky integration tests")] == ["text"]
    assert loose.recall("tomatoes in the garden") == []


def test_the_lexical_embedder_prefers_shared_words() -> None:
    e = HashedLexicalEmbedder()
    base = e.embed("database migrations run before deploy")
    assert cosine(base, e.embed("run the database migrations")) > 0.3
    assert cosine(base, e.embed("the cat sat on a mat")) < 0.15
    assert e.embed("same text") == e.embed("same text")


def test_after_turn_operations(store: MemoryStore) -> None:
    store.apply(
        [
            {"op": "add", "subject": "api", "text": "The API is versioned."},
            {"op": "add", "subject": "sdk", "text": "The SDK wraps the API."},
            {"op": "link", "a": "api", "b": "sdk"},
        ]
    )
    (api, _sdk) = store.facts()
    store.apply(
        [{"op": "rewrite", "id": api.id, "text": "The API is v2."}, {"op": "delete", "id": _sdk.id}]
    )
    assert [f.text for f in store.facts()] == ["The API is v2."]
    with pytest.raises(MemoryInputError, match="unknown memory operation"):
        store.apply([{"op": "forget-everything"}])
    with pytest.raises(MemoryInputError, match="'link' needs b"):
        store.apply([{"op": "link", "a": "api"}])


def test_pruning_keeps_the_last_20_turn_records(tmp_path: Path) -> None:
    records = tmp_path / "turns"
    records.mkdir()
    for n in range(1, 26):
        (records / f"turn-{n:06d}.json").write_text("{}")
    (records / "turn-000003").mkdir()
    (records / "turn-000003" / "blob").write_text("x")
    (records / "conversation.json").write_text("{}")
    removed = prune_turn_records(records)
    left = sorted(p.name for p in records.iterdir())
    assert len(removed) == 6
    assert left[0] == "conversation.json"
    assert left[1:] == [f"turn-{n:06d}.json" for n in range(6, 26)]
    assert prune_turn_records(records) == []
