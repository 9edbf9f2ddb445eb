"""The docs' generated parts (hack/docs-gen.py, `make docs-check` in `make test`): docs/cli.md
matches the code, and a column or a flag the docs lost is caught, not passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "docs-gen.py"
DOC = ROOT / "docs" / "cli.md"


def _check(doc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--doc", str(doc)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_cli_doc_matches_the_code() -> None:
    done = _check(DOC)
    assert done.returncode == 0, done.stderr


def test_a_stale_column_or_flag_is_drift(tmp_path: Path) -> None:
    text = DOC.read_text()
    for stale in (text.replace("FROZEN WAKES AGE |", "WAKES AGE |", 1),
                  text.replace("  -w, --watch ", "  --watch ", 1)):  # fmt: skip
        assert stale != text
        copy = tmp_path / "cli.md"
        copy.write_text(stale)
        done = _check(copy)
        assert done.returncode == 1 and "run `make docs`" in done.stderr, done.stderr
        assert copy.read_text() == stale  # --check writes nothing
