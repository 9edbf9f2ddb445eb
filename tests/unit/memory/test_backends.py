"""One conformance suite, run on SQLite and on a real PostgreSQL server: the same writes give
the same facts, links, origins, ranking and scope confinement on both."""

from __future__ import annotations

import time

import pytest

from corral_common.memory import MemoryInputError, MemoryStore, Origin

from .conftest import OpenBackend


def test_writes_keep_their_origin_and_survive_a_new_connection(
    open_backend: OpenBackend, scope: str
) -> None:
    first = MemoryStore(open_backend(), scope)
    fid = first.add("billing service", "Billing runs on port 8443.", Origin("s1", "1"))
    kept = first.add("ledger", "The ledger is append-only.", Origin("s1", "2"))
    first.rewrite(fid, "Billing runs on port 9443.", Origin("s2", "1"))
    first.link("Billing Service", "ledger")
    first.close()

    # A new connection (a new custodian, a new pod) sees exactly what was written.
    again = MemoryStore(open_backend(), scope)
    facts = {f.id: f for f in again.facts()}
    assert facts[fid].text == "Billing runs on port 9443."
    assert facts[fid].origin == Origin("s2", "1")  # the last writer is the origin
    assert facts[kept].origin == Origin("s1", "2")
    hits = again.recall("is the billing service up?")
    assert [(h.fact.id, h.via) for h in hits] == [(fid, "subject"), (kept, "link")]
    assert hits[0].line() == (
        f"[memory #{fid} via subject; from session s2 turn 1] "
        "billing service: Billing runs on port 9443."
    )


def test_delete_rewrite_and_link_refuse_what_is_not_there(
    open_backend: OpenBackend, scope: str
) -> None:
    store = MemoryStore(open_backend(), scope)
    fid = store.add("api", "The API is versioned.")
    store.delete(fid)
    assert store.facts() == []
    with pytest.raises(MemoryInputError, match="no fact"):
        store.delete(fid)
    with pytest.raises(MemoryInputError, match="no fact"):
        store.rewrite(fid, "x")
    with pytest.raises(MemoryInputError, match="two different subjects"):
        store.link("API", "api")
    with pytest.raises(MemoryInputError, match="needs text"):
        store.add("api", "   ")
    with pytest.raises(MemoryInputError, match="at most"):
        store.add("api", "x" * 5000)
    store.link("api", "sdk")
    store.link("sdk", "api")  # the same link, either way round: stored once
    assert store.backend.links(scope) == [("api", "sdk")]


def test_scopes_are_confined_on_a_shared_store(open_backend: OpenBackend, scope: str) -> None:
    mine = MemoryStore(open_backend(), scope)
    theirs = MemoryStore(open_backend(), scope.replace("/agent", "-other/agent"))
    fid = mine.add("deploy", "Deploys go through the release branch.")
    mine.link("deploy", "release")
    assert theirs.facts() == [] and theirs.recall("how do I deploy") == []
    with pytest.raises(MemoryInputError):
        theirs.delete(fid)
    with pytest.raises(MemoryInputError):
        theirs.rewrite(fid, "hijacked")
    assert theirs.backend.links(theirs.scope) == []
    assert [f.text for f in mine.facts()] == ["Deploys go through the release branch."]


def test_ranking_is_the_same_on_both(open_backend: OpenBackend, scope: str) -> None:
    store = MemoryStore(open_backend(), scope)
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
    assert store.recall("the payments integration tests are flaky again", limit=1)[0].via == (
        "subject"
    )


def test_recall_over_a_few_hundred_facts_is_quick(open_backend: OpenBackend, scope: str) -> None:
    store = MemoryStore(open_backend(), scope)
    for n in range(300):
        store.add(f"service {n}", f"Service {n} listens on port {8000 + n} and logs to stdout.")
    started = time.perf_counter()
    hits = store.recall("which port does service 42 listen on")
    elapsed = time.perf_counter() - started
    assert hits[0].fact.subject == "service 42"
    assert elapsed < 1.0, f"recall over 300 facts took {elapsed:.3f}s"
