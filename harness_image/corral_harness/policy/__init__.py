"""Which tools the model sees and may call, and the TurnPolicy the turn consults.

Import `CorralTurnPolicy` from `corral_harness.policy.turn_policy`; this package's root keeps
to the pure rules so importing it costs little.
"""

from .always_ask import ask_reason, shell_ask_reason
from .fixed_rule import FORBIDDEN, MENU_PREFIX, forbidden_reason
from .permissions import MAX_VISIBLE_TOOLS, decide, filter_catalog
from .structured import structured_output_errors
from .tool_search import TOOL_SEARCH, TOOL_SEARCH_NAME, answer_tool_search

__all__ = [
    "FORBIDDEN",
    "MAX_VISIBLE_TOOLS",
    "MENU_PREFIX",
    "TOOL_SEARCH",
    "TOOL_SEARCH_NAME",
    "answer_tool_search",
    "ask_reason",
    "decide",
    "filter_catalog",
    "forbidden_reason",
    "shell_ask_reason",
    "structured_output_errors",
]
