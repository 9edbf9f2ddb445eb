"""Log lines of the three processes: JSON with the bound run id and Session, or text."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from corral_common import logs


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Logger]]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    logs.configure("json", logging.INFO, stream)
    try:
        yield stream, logging.getLogger("corral.test")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_carries_the_bound_fields_its_extras_and_the_exception(
    captured: tuple[io.StringIO, logging.Logger],
) -> None:
    stream, log = captured
    with logs.bound(session="agents/fix", runId="fix.2"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("turn %d failed", 2, extra={"status": "failed"})
    log.info("outside")
    inside, outside = _lines(stream)
    assert inside["message"] == "turn 2 failed" and inside["level"] == "ERROR"
    assert (inside["runId"], inside["session"], inside["status"]) == (
        "fix.2",
        "agents/fix",
        "failed",
    )
    assert "RuntimeError: boom" in str(inside["exception"])
    assert str(inside["time"]).endswith("Z") and inside["logger"] == "corral.test"
    assert "runId" not in outside and "session" not in outside


def test_kopfs_object_reference_becomes_the_object_field(
    captured: tuple[io.StringIO, logging.Logger],
) -> None:
    stream, log = captured
    ref = {"apiVersion": "corral.dev/v1alpha1", "kind": "Session", "namespace": "a", "name": "s"}
    log.info("handler done", extra={"k8s_ref": ref, "k8s_skip": False})
    (line,) = _lines(stream)
    assert line["object"] == "a/s" and "k8s_skip" not in line and "k8s_ref" not in line


async def test_concurrent_tasks_keep_their_own_run_ids(
    captured: tuple[io.StringIO, logging.Logger],
) -> None:
    stream, log = captured

    async def run(run_id: str) -> None:
        logs.bind(runId=run_id)  # a task's own context: never seen by the other
        await asyncio.sleep(0)
        log.info("step of %s", run_id)

    await asyncio.gather(run("a.1"), run("b.1"))
    log.info("after")
    by_message = {str(line["message"]): line.get("runId") for line in _lines(stream)}
    assert by_message == {"step of a.1": "a.1", "step of b.1": "b.1", "after": None}


def test_the_text_format_appends_the_run_id() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter())
    log = logging.getLogger("corral.test.text")
    log.addHandler(handler)
    log.propagate = False
    try:
        with logs.bound(runId="r.1"):
            log.warning("refused")
        log.warning("plain")
    finally:
        log.removeHandler(handler)
    first, second = stream.getvalue().splitlines()
    assert first.endswith("WARNING corral.test.text: refused [run r.1]")
    assert second.endswith("WARNING corral.test.text: plain")


@pytest.mark.parametrize(("given", "wanted"), [("JSON", "json"), ("text", "text"), ("", "text")])
def test_the_format_switch(given: str, wanted: str) -> None:
    assert logs.parse_format(given) == wanted


def test_an_unknown_format_is_refused_naming_the_switch() -> None:
    with pytest.raises(ValueError, match="CORRAL_LOG_FORMAT/--log-format must be json or text"):
        logs.parse_format("yaml")
