"""The source keeps the shape the house-in-order round gave it: no function over 120 lines
(a nested function's lines count toward the function that holds it). ruff's C901 keeps each
function at cyclomatic complexity 25 or less and pylint's duplicate-code check keeps copies
out; both run in `make lint`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = [
    REPO / "api" / "corral_api",
    REPO / "kube" / "corral_kube",
    REPO / "operator" / "corral_operator",
    REPO / "harness_image" / "corral_harness",
    REPO / "harness_image" / "corral_custodian",
    REPO / "harness_image" / "corral_common",
    REPO / "cli" / "corral_cli",
    REPO / "devtools" / "corral_dev",
]
MAX_LINES = 120


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function in `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_the_check_finds_a_long_function_and_counts_nested_ones_in_their_parent() -> None:
    inner = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    source = (
        f"def outer():\n    def inner():\n{inner}\n    return inner\n\ndef short():\n    pass\n"
    )
    found = long_functions(source)
    assert [name for name, _, _ in found] == ["outer", "inner"]
    assert found[0][2] == MAX_LINES + 3


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_function_in_the_source_is_over_120_lines(package: Path) -> None:
    files = sorted(package.rglob("*.py"))
    assert files, f"no sources under {package}"
    over = [
        f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
        for path in files
        for name, line, length in long_functions(path.read_text())
    ]
    assert not over, "functions over 120 lines (split them into named steps):\n" + "\n".join(over)
