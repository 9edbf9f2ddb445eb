"""What goes into the model's window: layers, instruction files, trimming and compaction."""

from .assembly import AssembledContext, LayerReport, Unit, assemble, render_units
from .compaction import (
    COMPACTION_MARKER,
    Summarizer,
    active_messages,
    apply_compaction,
    extractive_summary,
    is_compaction_entry,
    merge_adjacent_roles,
)
from .instructions import InstructionFileCache, instruction_units, scan_instruction_files
from .layers import (
    DEFAULT_BUDGETS,
    DEFAULT_STRATEGIES,
    LAYER_ORDER,
    LayerName,
    Strategy,
    UnknownLayer,
    resolve_budgets,
)
from .tokenizer import DEFAULT_TOKENIZER, ByteEstimateTokenizer, Tokenizer
from .trimming import TRUNCATION_MARKER
from .window import CONSERVATIVE_WINDOW, WindowFit, fit_window, usable_budget, window_for

__all__ = [
    "COMPACTION_MARKER",
    "CONSERVATIVE_WINDOW",
    "DEFAULT_BUDGETS",
    "DEFAULT_STRATEGIES",
    "DEFAULT_TOKENIZER",
    "LAYER_ORDER",
    "TRUNCATION_MARKER",
    "AssembledContext",
    "ByteEstimateTokenizer",
    "InstructionFileCache",
    "LayerName",
    "LayerReport",
    "Strategy",
    "Summarizer",
    "Tokenizer",
    "Unit",
    "UnknownLayer",
    "WindowFit",
    "active_messages",
    "apply_compaction",
    "assemble",
    "extractive_summary",
    "fit_window",
    "instruction_units",
    "is_compaction_entry",
    "merge_adjacent_roles",
    "render_units",
    "resolve_budgets",
    "scan_instruction_files",
    "usable_budget",
    "window_for",
]
