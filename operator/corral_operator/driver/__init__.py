"""The turn driver: one implementation of "drive a session's turns", shared by the operator and
`corral run`. Pure except for what it is handed: a `WirePort` (the harness) and a `TurnStore`."""

from ._children import (
    ChildrenReport,
    children_report,
    hold_for_children,
    running_children,
    wait_satisfied,
    waiting_for_of,
)
from ._decide import (
    SUSPEND_CAUSE,
    decide_after_settlement,
    evaluate_exit,
    evaluate_substring,
    follow_up_message,
    needs_evaluation,
)
from ._faults import (
    AdmissionRejected,
    AnswerTooLarge,
    ConversationLost,
    SettlementFault,
    WireFault,
    WireRequestFailed,
    WireVersionUnsupported,
    byte_size,
)
from ._ports import CheckResult, EventSink, TurnStore, WirePort
from ._session import SessionDriver, admission_attempt, resume_message
from ._state import (
    Decision,
    DriverOutcome,
    DriverState,
    EvaluationResult,
    add_usage,
)
from ._wake import WAITING_FOR_WAKE, seconds_until_wake

__all__ = [
    "SUSPEND_CAUSE",
    "WAITING_FOR_WAKE",
    "AdmissionRejected",
    "AnswerTooLarge",
    "CheckResult",
    "ChildrenReport",
    "ConversationLost",
    "Decision",
    "DriverOutcome",
    "DriverState",
    "EvaluationResult",
    "EventSink",
    "SessionDriver",
    "SettlementFault",
    "TurnStore",
    "WireFault",
    "WirePort",
    "WireRequestFailed",
    "WireVersionUnsupported",
    "add_usage",
    "admission_attempt",
    "byte_size",
    "children_report",
    "decide_after_settlement",
    "evaluate_exit",
    "evaluate_substring",
    "follow_up_message",
    "hold_for_children",
    "needs_evaluation",
    "resume_message",
    "running_children",
    "seconds_until_wake",
    "wait_satisfied",
    "waiting_for_of",
]
