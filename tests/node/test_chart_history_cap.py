"""The chart's read cap (`operator.maxHistoryBytes`, docs/operations.md), rendered with `helm
template`: 64 MiB by default, passed to the operator as `--max-history-bytes` in whole bytes,
and a value the operator would refuse is refused by the values schema first."""

from __future__ import annotations

from .test_chart import helm_template, operator_args, rendered

WATCH = 'watchNamespaces=["default"]'


def _args(*values: str) -> list[str]:
    return operator_args(rendered(WATCH, *values))


def test_the_cap_is_64_mib_by_default_and_set_in_whole_bytes() -> None:
    assert "--max-history-bytes=67108864" in _args()
    # A large value stays an integer (helm would print the float 2.68435456e+08).
    assert "--max-history-bytes=268435456" in _args('operator={"maxHistoryBytes": 268435456}')


def test_a_cap_the_operator_would_refuse_is_refused_by_the_schema() -> None:
    for bad in ("1000", '"64Mi"', "65536.5"):
        done = helm_template(WATCH, f'operator={{"maxHistoryBytes": {bad}}}')
        assert done.returncode != 0 and "maxHistoryBytes" in done.stderr, (bad, done.stderr)
