"""The chart's archive values (docs/history.md), rendered with `helm template`: a
PersistentVolumeClaim by default; with `archive.s3.endpoint` the operator archives to the
object store, mounts the credentials Secret (and nothing else gets it), and makes no claim."""

from __future__ import annotations

from typing import Any

from .test_chart import find, helm_template, operator_deployment, rendered

WATCH = 'watchNamespaces=["default"]'
S3 = (
    'archive={"s3": {"endpoint": "https://s3.eu-west-1.amazonaws.com", "bucket": "audit", '
    '"region": "eu-west-1", "prefix": "corral", "credentialsSecret": "archive-keys"}}'
)


def _operator(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(operator_deployment(docs)["spec"]["template"]["spec"])


def test_a_claim_by_default() -> None:
    docs = rendered(WATCH)
    args = _operator(docs)["containers"][0]["args"]
    assert "--archive-dir=/var/lib/corral/archive" in args
    assert not any(a.startswith("--archive-s3") for a in args)
    assert [c["metadata"]["name"] for c in find(docs, "PersistentVolumeClaim")] == [
        "corral-archive"
    ]


def test_s3_replaces_the_claim_and_only_the_operator_mounts_the_keys() -> None:
    docs = rendered(WATCH, S3)
    spec = _operator(docs)
    args = spec["containers"][0]["args"]
    assert {
        "--archive-s3-endpoint=https://s3.eu-west-1.amazonaws.com",
        "--archive-s3-bucket=audit",
        "--archive-s3-region=eu-west-1",
        "--archive-s3-prefix=corral",
        "--archive-s3-credentials-dir=/etc/corral/archive-s3",
    } <= set(args)
    assert not any(a.startswith("--archive-dir") for a in args)
    volume = next(v for v in spec["volumes"] if v["name"] == "archive-s3")
    assert volume["secret"]["secretName"] == "archive-keys"
    assert find(docs, "PersistentVolumeClaim") == []
    # The reader's Service stays: people read S3 archives through the operator too.
    assert any(s["metadata"]["name"] == "corral-archive" for s in find(docs, "Service"))


def test_s3_without_a_bucket_or_secret_is_refused_naming_it() -> None:
    no_bucket = helm_template(WATCH, 'archive={"s3": {"endpoint": "http://minio:9000", '
                                     '"credentialsSecret": "k"}}')  # fmt: skip
    assert no_bucket.returncode != 0 and "archive.s3.bucket is required" in no_bucket.stderr
    no_keys = helm_template(WATCH, 'archive={"s3": {"endpoint": "http://minio:9000", '
                                   '"bucket": "audit"}}')  # fmt: skip
    assert no_keys.returncode != 0
    assert "archive.s3.credentialsSecret is required" in no_keys.stderr
    bad = helm_template(WATCH, 'archive={"s3": {"endpoint": "minio:9000"}}')
    assert bad.returncode != 0 and "endpoint" in bad.stderr
