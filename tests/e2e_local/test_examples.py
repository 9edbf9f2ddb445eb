"""Every example says in its header how to run it and what to expect; the `corral run` ones are
run here exactly as their headers say (the `$ corral ...` lines, from the project root, with no
ANTHROPIC_API_KEY so the scripted demo model plays demo/scenario.yaml) and hold to what the
header promises. The `kubectl` lines run in tests/cluster/test_examples.py."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests._examples import EXAMPLES, ROOT, Example, all_examples

from .conftest import corral_argv, git, run_env

pytestmark = pytest.mark.timeout(150)

RUN_BY_CORRAL = [e for e in all_examples() if e.commands_of("corral")]


def _kinds(example: Example) -> set[str]:
    return {doc["kind"] for doc in yaml.safe_load_all(example.path.read_text()) if doc}


def test_every_example_says_how_to_run_it_and_what_to_expect() -> None:
    for example in all_examples():
        assert example.commands, f"{example.name}: no `$ COMMAND` line in its header"
        for command in example.commands:  # each is run by this tier or the cluster's
            assert command[0] == "kubectl" or command[:2] == ("corral", "run"), command
        assert "Expect:" in example.header, f"{example.name}: its header promises nothing"
        runs = " ".join(" ".join(c) for c in example.commands)
        assert example.name in runs, f"{example.name}: no command of its header names it"


def test_what_changes_the_whole_namespace_lives_apart_from_the_folder_people_apply() -> None:
    """`kubectl apply -f examples/` must not freeze every Session or retune every sandbox:
    Freezes and the model catalog live in examples/admin/, which that does not read."""
    top = [e for e in all_examples() if e.path.parent == EXAMPLES]
    admin = [e for e in all_examples() if e.path.parent == EXAMPLES / "admin"]
    assert top and admin
    for example in top:
        assert not _kinds(example) & {"Freeze", "ConfigMap"}, example.name
    for example in admin:
        assert _kinds(example) <= {"Freeze", "ConfigMap"}, example.name


def _files_under(directory: Path) -> set[str]:
    return {
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if "__pycache__" not in p.parts and ".pytest_cache" not in p.parts
    }


def _run(command: list[str], state_home: Path) -> subprocess.CompletedProcess[str]:
    assert command[0] == "corral"
    env = run_env() | {"XDG_STATE_HOME": str(state_home.parent)}
    return subprocess.run(
        [*corral_argv(), *command[1:]],
        cwd=ROOT,  # the headers name examples/... from the project's root
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _state_dir(stdout: str) -> Path:
    found = re.search(r"^state directory: (\S+)$", stdout, re.M)
    assert found, stdout
    return Path(found[1])


def _session_yaml(done: subprocess.CompletedProcess[str], state_home: Path) -> None:
    assert "Succeeded: evaluation passed on turn 1" in done.stdout
    workspace = _state_dir(done.stdout) / "workspace"
    assert _state_dir(done.stdout).parent == state_home / "runs"
    fixed = git(workspace, "show", "corral/fix-discount:shop/pricing.py")
    assert "discount = subtotal * discount_percent / 100\n" in fixed
    assert git(workspace, "log", "-1", "--format=%an", "corral/fix-discount").strip() == "fixer"


def _session_plan_yaml(done: subprocess.CompletedProcess[str], state_home: Path) -> None:
    assert "Succeeded: turn 1 completed" in done.stdout
    plan = done.stdout[done.stdout.rindex("plan (Done):") :].splitlines()[1:4]
    assert [line.split("[")[1].split("]")[0] for line in plan] == ["Held"] * 3, plan
    assert "2. Divide the discount percentage by 100" in plan[1], plan  # as replanned
    state = _state_dir(done.stdout)
    ledger = [json.loads(line) for line in (state / "ledger.jsonl").read_text().splitlines()]
    receipt = ledger[-1]
    assert receipt["kind"] == "settlement" and receipt["outcome"] == "success", receipt
    workspace = state / "workspace"
    fixed = git(workspace, "show", "corral/fix-discount-plan:shop/pricing.py")
    assert "discount = subtotal * discount_percent / 100\n" in fixed


def _session_structured_output_yaml(
    done: subprocess.CompletedProcess[str], state_home: Path
) -> None:
    assert "Succeeded: turn 1 completed" in done.stdout
    lines = done.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")  # the object, printed last
    printed: dict[str, Any] = json.loads("\n".join(lines[start:]))
    assert printed["verdict"] == "request_changes" and printed["score"] == 3, printed
    assert [(f["file"], f["line"]) for f in printed["findings"]] == [("shop/pricing.py", 18)]
    assert "nothing committed on corral/review-discount" in done.stdout  # readOnly


CHECKS: dict[str, Callable[[subprocess.CompletedProcess[str], Path], None]] = {
    "examples/session.yaml": _session_yaml,
    "examples/session-plan.yaml": _session_plan_yaml,
    "examples/session-structured-output.yaml": _session_structured_output_yaml,
}


def test_every_corral_example_has_its_check() -> None:
    assert sorted(e.name for e in RUN_BY_CORRAL) == sorted(CHECKS)


@pytest.mark.parametrize("example", RUN_BY_CORRAL, ids=lambda e: e.path.name)
def test_the_example_does_what_its_header_says(example: Example, state_home: Path) -> None:
    before = _files_under(EXAMPLES)
    started = time.monotonic()
    for command in example.commands_of("corral"):
        done = _run(command, state_home)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
        CHECKS[example.name](done, state_home)
    assert _files_under(EXAMPLES) == before  # the run worked on a copy
    print(f"{example.name}: {time.monotonic() - started:.1f}s")
