"""Tracing in process: the SDK's in-memory exporter gets the run's spans (docs/tracing.md)."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral_harness.telemetry import OFF, Tracing, trace_id_of


def test_an_unconfigured_tracer_is_the_no_op_run() -> None:
    assert Tracing().run("r", "c", "m") is OFF


def test_the_run_span_and_its_children_share_the_run_ids_trace() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing()
    tracing.install(exporter)
    run = tracing.run("run-7", "conv", "claude-x")
    run.model_call(0)
    run.model_done(12, 3, "tool_use")
    run.tool_start("call-1", "bash")
    run.tool_end("call-1", error="tool_error")
    run.model_call(1)  # cut: the run ends before the answer
    run.end("failed", error_type="runaway", tokens=15, steps=1)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"invoke_agent", "chat claude-x", "execute_tool bash"}
    assert {s.context.trace_id for s in spans.values()} == {trace_id_of("run-7")}
    root = spans["invoke_agent"]
    assert root.attributes is not None and root.attributes["error.type"] == "runaway"
    assert root.attributes["run.tokens"] == 15
    tool = spans["execute_tool bash"]
    assert tool.parent is not None and tool.parent.span_id == root.context.span_id
    assert tool.attributes is not None and tool.attributes["error.type"] == "tool_error"
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert [
        c.attributes["gen_ai.usage.input_tokens"]
        for c in chats
        if c.attributes and "gen_ai.usage.input_tokens" in c.attributes
    ] == [12]
    assert any(c.attributes and c.attributes.get("error.type") == "did_not_finish" for c in chats)
    tracing.shutdown()
