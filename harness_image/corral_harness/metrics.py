"""Prometheus metrics of the harness, served at /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry()

SUBMISSIONS = Counter(
    "corral_harness_submissions_total", "Settled submissions.", ["status"], registry=REGISTRY
)
MODEL_REQUESTS = Counter(
    "corral_harness_model_answers_total", "Model answers received.", registry=REGISTRY
)
TOOL_CALLS = Counter(
    "corral_harness_tool_calls_total",
    "Tool calls that ended.",
    ["tool", "error"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "corral_harness_tokens_total", "Tokens reported by the model.", ["kind"], registry=REGISTRY
)
STEP_SECONDS = Histogram(
    "corral_harness_step_seconds",
    "Time from one step boundary to the next.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30, 120),
    registry=REGISTRY,
)
