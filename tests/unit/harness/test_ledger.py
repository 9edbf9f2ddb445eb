"""The turn's ledger: two writers, append-only entries, the receipt made from them."""

from __future__ import annotations

import pytest

from corral_api.wire import TURN_RECEIPT_KEYS, TurnReceipt
from corral_harness.engine.seam import Usage
from corral_harness.ledger import LedgerEntry, LedgerError, TurnLedger


def test_a_reactive_turn_with_nothing_chosen_reads_reactive() -> None:
    receipt = TurnLedger().to_receipt()
    assert receipt["route"] == receipt["handler"] == receipt["requestedLoop"] == "reactive"
    assert receipt["tokensByLayer"] == {"classifier": 0, "planner": 0, "reactive": 0, "executor": 0}
    assert receipt["phasePath"] == [] and receipt["outcome"] == "success"


def test_the_receipt_folds_both_writers_entries() -> None:
    ledger = TurnLedger()
    ledger.set_requested_loop("auto")
    ledger.phase("understand")
    ledger.add_tokens("classifier", Usage(input=30, output=5))
    ledger.set_route("oneTool")
    ledger.set_handler("oneTool")
    ledger.phase("execute")
    ledger.tool_run("bash")
    ledger.tool_blocked("write", "outside the granted root")
    ledger.add_tokens("executor", 100)
    ledger.add_tokens("executor", Usage(input=7, output=3))
    ledger.set_outcome("partial")
    receipt = {
        **ledger.to_receipt(),
        "model": "m",
        "thinkingLevel": "low",
        "steps": 2,
        "contextTokens": {},
        "usage": None,
    }
    assert set(receipt) == TURN_RECEIPT_KEYS
    parsed = TurnReceipt.model_validate(receipt)
    assert parsed.requestedLoop == "auto" and parsed.route == "oneTool"
    assert parsed.tokensByLayer.classifier == 35 and parsed.tokensByLayer.executor == 110
    assert parsed.toolsRun == ["bash"] and parsed.toolsBlocked == ["write"]
    assert parsed.phasePath == ["understand", "execute"] and parsed.outcome == "partial"
    # The tool runner's entries carry their writer; the loop's theirs.
    writers = {e.kind: e.writer for e in ledger.entries}
    assert writers["tool_run"] == writers["tool_blocked"] == "tools"
    assert {writers[k] for k in ("phase", "route", "tokens", "outcome")} == {"loop"}
    assert ledger.total_tokens() == 145


def test_a_later_entry_never_rewrites_an_earlier_one() -> None:
    ledger = TurnLedger()
    ledger.set_route("investigate")
    ledger.set_route("reactive")  # reclassified after the investigation
    assert ledger.to_receipt()["route"] == "reactive"
    assert [e.value for e in ledger.entries if e.kind == "route"] == ["investigate", "reactive"]


@pytest.mark.parametrize(
    "bad",
    [
        lambda ledger: ledger.add_tokens("judge", 1),
        lambda ledger: ledger.set_outcome("maybe"),
        lambda ledger: ledger._append(LedgerEntry("tools", "phase", "execute")),
        lambda ledger: ledger._append(LedgerEntry("loop", "tool_run", "bash")),
    ],
    ids=["unknown-layer", "unknown-outcome", "tools-writes-a-phase", "loop-writes-a-tool"],
)
def test_out_of_range_values_and_foreign_kinds_are_refused(bad: object) -> None:
    ledger = TurnLedger()
    with pytest.raises(LedgerError):
        bad(ledger)  # type: ignore[operator]
    assert ledger.entries == []
