"""`corral get`'s output (printer columns, -o name|jsonpath|custom-columns, --no-headers), the
JSONPath subset, `corral describe` of any kind, `-f -`/`-f DIR`, and `corral run`'s inline
flags: pure, objects and files in, text out (docs/cli.md)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest
import yaml

from corral_api import KINDS as API_KINDS
from corral_cli._jsonpath import (
    JsonPathError,
    column_cell,
    evaluate,
    parse_columns,
    render_template,
)
from corral_cli._manifests import ManifestError, expand_paths, load_manifests
from corral_cli._run_flags import dry_run_text, with_flags
from corral_cli._tables import KINDS, custom_rows, resource_name, rows
from corral_cli.describe_cmd import field_lines, render_object
from corral_cli.get_cmd import Output
from corral_cli.run_cmd import build_parser as run_parser

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "charts" / "corral" / "crds"
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _crd(plural: str) -> dict[str, object]:
    loaded = yaml.safe_load((CRDS / f"corral.dev_{plural}.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _obj(kind: str, name: str, **fields: object) -> dict[str, object]:
    meta = {"name": name, "namespace": "team", "creationTimestamp": "2027-01-15T07:00:00Z"}
    return {"kind": kind, "metadata": meta, **fields}


@pytest.mark.parametrize("model", API_KINDS, ids=lambda m: m.info.kind)
def test_every_kind_is_named_as_its_crd_names_it(model: type) -> None:
    info = model.info  # type: ignore[attr-defined]
    names = _crd(info.plural)["spec"]["names"]  # type: ignore[index]
    for word in [names["plural"], names["singular"], *names["shortNames"]]:
        assert KINDS[word] == (info.kind, info.plural)


@pytest.mark.parametrize("model", API_KINDS, ids=lambda m: m.info.kind)
def test_the_columns_are_the_crds_printer_columns(model: type) -> None:
    kind = model.info.kind  # type: ignore[attr-defined]
    version = _crd(model.info.plural)["spec"]["versions"][0]  # type: ignore[attr-defined,index]
    columns = version["additionalPrinterColumns"]
    narrow = [c["name"].upper() for c in columns if not c.get("priority")]
    assert rows(kind, [], NOW)[0] == ["NAME", *narrow]
    assert rows(kind, [], NOW, wide=True)[0] == ["NAME", *(c["name"].upper() for c in columns)]


def test_cells_follow_the_columns_json_paths_and_types() -> None:
    agent = _obj("Agent", "coder", spec={"model": "m1", "loop": "reactive", "orchestrator": True},
                 status={"conditions": [{"type": "Other", "status": "False"},
                                        {"type": "Ready", "status": "True"}]})  # fmt: skip
    assert rows("Agent", [agent], NOW) == [
        ["NAME", "MODEL", "LOOP", "ORCHESTRATOR", "READY", "AGE"],
        ["coder", "m1", "reactive", "true", "True", "1h"],
    ]
    freeze = _obj("Freeze", "hold", spec={"scope": {"namespace": True}, "frozen": True,
                                          "reason": "incident"})  # fmt: skip
    table = rows("Freeze", [freeze], NOW, namespaces=True, header=False)
    assert table == [["team", "hold", "", "", "true", "true", "1h"]]
    assert rows("Freeze", [freeze], NOW, wide=True)[1][-2] == "incident"


def test_an_undecided_approval_reads_pending_and_a_decided_one_its_decision() -> None:
    asked = _obj("Approval", "a1", spec={"sessionRef": {"name": "s"}, "action": {"tool": "land"}})
    decided = _obj("Approval", "a2", spec={"sessionRef": {"name": "s"}, "action": {"tool": "land"}},
                   status={"decision": "Denied"})  # fmt: skip
    assert [r[3] for r in rows("Approval", [asked, decided], NOW, header=False)] == [
        "Pending",
        "Denied",
    ]


def test_names_and_custom_columns() -> None:
    items = [_obj("Session", "s1", status={"phase": "Running"}), _obj("Session", "s2")]
    assert resource_name("Session", items[0]) == "session.corral.dev/s1"
    columns = parse_columns("NAME:.metadata.name,PHASE:{.status.phase}")
    assert custom_rows(columns, items) == [["NAME", "PHASE"], ["s1", "Running"], ["s2", "<none>"]]
    assert custom_rows(columns, items, header=False)[0] == ["s1", "Running"]
    with pytest.raises(JsonPathError, match="HEADER:PATH"):
        parse_columns("NAME")


def test_the_jsonpath_subset() -> None:
    doc = {"kind": "List", "items": [
        {"metadata": {"name": "a", "labels": {"corral.dev/agent": "x"}},
         "status": {"conditions": [{"type": "Ready", "status": "True"}], "turns": 2}},
        {"metadata": {"name": "b"}, "status": {"turns": 0}},
    ]}  # fmt: skip
    assert render_template("{.items[*].metadata.name}", doc) == "a b"
    assert render_template("{$.items[0].metadata.labels['corral.dev/agent']}", doc) == "x"
    assert render_template("{.items[-1].status.turns}", doc) == "0"
    assert render_template('{.items[0].status.conditions[?(@.type=="Ready")].status}', doc) == (
        "True"
    )
    assert render_template("{.items[?(@.status.turns!=0)].metadata.name}", doc) == "a"
    template = '{range .items[*]}{.metadata.name}{"\\t"}{.status.turns}{"\\n"}{end}'
    assert render_template(template, doc) == "a\t2\nb\t0\n"
    assert render_template("names: {.items[*].metadata.name}!", doc) == "names: a b!"
    assert render_template("{.items[0].metadata}", doc).startswith('{"name": "a"')
    assert evaluate(".nothing.here", doc) == [] and column_cell(".nothing", doc) == "<none>"
    for bad in ("{..name}", "{range .items[*]}{.x}", "{.a}{end}", "{.a"):
        with pytest.raises(JsonPathError):
            render_template(bad, doc)


def test_output_refuses_a_format_before_anything_is_fetched() -> None:
    from corral_cli._errors import CommandError

    for bad in ("tabel", "jsonpath=", "jsonpath={..x}", "custom-columns=NAME"):
        with pytest.raises(CommandError):
            Output("Session", bad, namespaces=False, headers=True)
    out = Output("Session", "name", namespaces=False, headers=True)
    assert out.listing([_obj("Session", "s1")], single=False, now=NOW) == "session.corral.dev/s1"
    out = Output("Session", "jsonpath={.metadata.name}", namespaces=False, headers=True)
    assert out.listing([_obj("Session", "s1")], single=True, now=NOW) == "s1"
    table = Output("Session", "table", namespaces=False, headers=False)
    text = table.listing([_obj("Session", "s1")], single=False, now=NOW)
    assert text is not None and text.startswith("s1 ")
    assert Output("Session", "table", namespaces=False, headers=True).listing(
        [], single=False, now=NOW) is None  # fmt: skip


def test_describe_any_kind_shows_fields_conditions_and_events() -> None:
    done = {"type": "Done", "status": "True", "reason": "Passed", "message": "ok"}
    goal = _obj("Goal", "g1", spec={"maxWaves": 3, "success": {"name": "tests"}},
                status={"verdict": "Pass", "conditions": [done]})  # fmt: skip
    goal["metadata"]["labels"] = {"team": "a"}  # type: ignore[index]
    event = {"metadata": {"creationTimestamp": "2027-01-15T07:59:00Z"}, "type": "Normal",
             "reason": "WaveStarted", "message": "wave 1",
             "source": {"component": "corral"}}  # fmt: skip
    text = render_object(goal, [event], NOW)
    assert "Name:          g1" in text and "Labels:        team=a" in text
    assert "  Max Waves:  3\n  Success:\n    Name:  tests" in text
    assert "Status:\n  Verdict:  Pass" in text
    conditions = text.split("Conditions:\n", 1)[1]
    assert conditions.splitlines()[1].split() == ["Done", "True", "Passed", "ok"]
    events = text.split("Events:\n", 1)[1].splitlines()
    assert events[1].split() == ["Normal", "WaveStarted", "1m", "corral", "wave", "1"]
    assert "Events:        <none>" in render_object(_obj("Freeze", "f"), [], NOW)
    assert field_lines({"allow": ["a", "b"], "rules": [{"host": "h", "port": 1}]}) == [
        "Allow:", "  - a", "  - b", "Rules:", "  - Host:  h", "    Port:  1"]  # fmt: skip


AGENT = """apiVersion: corral.dev/v1alpha1
kind: Agent
metadata: {name: coder}
spec: {identity: you code, model: claude-sonnet-4-5, limits: {maxTurns: 5}}
"""
SESSION = """apiVersion: corral.dev/v1alpha1
kind: Session
metadata: {name: s1}
spec: {agentRef: coder, task: fix it, workspace: {repo: demo/repo}, budget: {tokens: 1000}}
"""


def test_f_takes_a_directory_sorted_and_recursive_only_with_R(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(SESSION)
    (tmp_path / "a.yml").write_text(AGENT)
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.json").write_text('{"kind": "List", "items": []}')
    assert expand_paths([tmp_path]) == [tmp_path / "a.yml", tmp_path / "b.yaml"]
    assert expand_paths([tmp_path], recursive=True)[-1] == tmp_path / "sub" / "c.json"
    found = load_manifests([tmp_path])
    assert list(found.agents) == ["coder"] and found.sessions[0].metadata["name"] == "s1"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match=r"no \*\.yaml"):
        expand_paths([tmp_path / "empty"])


def test_f_dash_reads_stdin_once(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [yaml.safe_load(AGENT), yaml.safe_load(SESSION)]
    listed = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    monkeypatch.setattr("sys.stdin", io.StringIO(listed))
    found = load_manifests([Path("-")])
    assert list(found.agents) == ["coder"] and len(found.sessions) == 1
    with pytest.raises(ManifestError, match="once"):
        expand_paths([Path("-"), Path("-")])


def _flags(tmp_path: Path, *extra: str) -> tuple[argparse.Namespace, object, object]:
    (tmp_path / "all.yaml").write_text(AGENT + "---\n" + SESSION)
    args = run_parser().parse_args(["-f", str(tmp_path / "all.yaml"), *extra])
    found = load_manifests(args.files)
    return args, found.sessions[0], found.agents["coder"]


def test_run_flags_write_the_fields_the_yaml_would(tmp_path: Path) -> None:
    args, session, agent = _flags(tmp_path, "--task", "other", "--model", "claude-haiku-4-5",
                                  "--max-turns", "2", "--max-budget-usd", "0.25")  # fmt: skip
    session, agent = with_flags(args, session, agent)  # type: ignore[arg-type]
    assert session.spec.task == "other"
    assert session.spec.overrides is not None and session.spec.overrides.model == "claude-haiku-4-5"
    assert session.spec.budget is not None
    assert (session.spec.budget.cost_usd, session.spec.budget.tokens) == (0.25, 1000)
    assert agent.spec.limits.max_turns == 2
    agent_doc, session_doc = yaml.safe_load_all(dry_run_text(session, agent, None))
    assert agent_doc["spec"]["limits"] == {"maxTurns": 2}
    assert session_doc["spec"]["overrides"] == {"model": "claude-haiku-4-5"}
    assert "status" not in session_doc and "thinkingLevel" not in agent_doc["spec"]


def test_run_flags_are_judged_as_the_yaml_is(tmp_path: Path) -> None:
    args, session, agent = _flags(tmp_path, "--max-turns", "0")
    with pytest.raises(ManifestError, match=r"--max-turns: .*maxTurns.*greater than or equal to 1"):
        with_flags(args, session, agent)  # type: ignore[arg-type]
    args, session, agent = _flags(tmp_path, "--max-budget-usd", "-1")
    with pytest.raises(ManifestError, match=r"--max-budget-usd: .*costUSD"):
        with_flags(args, session, agent)  # type: ignore[arg-type]
