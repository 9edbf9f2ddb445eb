"""The examples' headers as the tests read them: each file in examples/ (and examples/admin/)
says in its leading comment how to run it, as `$ COMMAND` lines, and what to expect after
`Expect:`. The tests run those very lines (tests/e2e_local/test_examples.py the `corral` ones,
tests/cluster/test_examples.py the `kubectl` ones), so a header and its test cannot drift.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
_COMMAND = re.compile(r"^#\s+\$ (?P<command>.+)$")


@dataclass(frozen=True)
class Example:
    path: Path
    header: str  # the leading comment, without its `# `
    commands: tuple[tuple[str, ...], ...]  # every `$` line, split as a shell would, in order

    @property
    def name(self) -> str:
        """The path as the headers write it: examples/...yaml."""
        return self.path.relative_to(ROOT).as_posix()

    def commands_of(self, program: str) -> list[list[str]]:
        return [list(c) for c in self.commands if c[0] == program]


def read_example(path: Path) -> Example:
    header: list[str] = []
    commands: list[tuple[str, ...]] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line[2:] if line.startswith("# ") else line[1:])
        found = _COMMAND.match(line)
        if found:
            commands.append(tuple(shlex.split(found["command"])))
    return Example(path, "\n".join(header), tuple(commands))


def all_examples() -> list[Example]:
    """Every manifest people apply or run: examples/*.yaml and examples/admin/*.yaml (not the
    demo repository and scenarios under examples/demo/)."""
    paths = sorted([*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("admin/*.yaml")])
    return [read_example(p) for p in paths]


def example(name: str) -> Example:
    return read_example(ROOT / name)
