"""The S3 archive backend against a real HTTP S3 server started here.

The server is moto's (`moto_server`, from the dev extra): a STAND-IN for S3, not S3 itself. It
is run with IAM authentication on (`INITIAL_NO_AUTH_ACTION_COUNT`), so it recomputes every
request's SigV4 signature with botocore and refuses a wrong one: the archive's own signer is
checked against the AWS SDK's on real requests here, and against AWS's published examples in
tests/unit/common/test_sigv4.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_operator.archive import build_record
from corral_operator.archive.s3 import S3Archive, S3Error
from corral_operator.archive.store import ArchiveTooLarge, FileArchive

from ..._moto_s3 import MotoS3, moto_s3

EVENTS = [
    {"offset": 0, "type": "turn_started", "submissionId": "s1"},
    {"offset": 1, "type": "message", "role": "assistant", "content": [{"type": "text",
     "text": "héllo / wörld"}]},
    {"offset": 2, "type": "settled", "submissionId": "s1", "status": "completed",
     "receipt": {"toolsRun": ["bash"]}},
]  # fmt: skip
SESSION = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Session",
    "metadata": {"name": "fix-it", "namespace": "agents", "uid": "u-1"},
    "spec": {"agentRef": "coder"},
    "status": {"phase": "Succeeded"},
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    with moto_s3(tmp_path_factory.mktemp("s3-credentials"), "corral-archive") as server:
        yield server


def _record(uid: str, stamp: str, events: list[dict[str, object]]) -> dict[str, object]:
    meta = {**SESSION["metadata"], "uid": uid}  # type: ignore[dict-item]
    return build_record({**SESSION, "metadata": meta}, events, archived_at=stamp, cause="finished")


def test_an_archive_is_written_and_read_back_whole(s3: MotoS3) -> None:
    store = S3Archive(s3.url, "corral-archive", "us-east-1", s3.credentials, prefix="/prod/")
    record = _record("u-1", "2026-01-01T00:00:00Z", EVENTS)
    store.write("agents", "fix-it", "u-1", record, EVENTS)
    back = store.read("agents", "fix-it", "u-1")
    assert back is not None and back.record == record and back.events == EVENTS
    assert back.events_from(2) == EVENTS[2:]
    # The same layout as the filesystem's, under the prefix.
    listed = store._list("prod/agents/fix-it/")
    assert sorted(listed) == ["prod/agents/fix-it/u-1/events.jsonl",
                              "prod/agents/fix-it/u-1/record.json"]  # fmt: skip


def test_the_last_archived_run_of_a_name_is_read_without_a_uid(s3: MotoS3) -> None:
    store = S3Archive(s3.url, "corral-archive", "us-east-1", s3.credentials, prefix="runs")
    store.write("agents", "again", "u-old", _record("u-old", "2026-01-01T00:00:00Z", []), [])
    store.write("agents", "again", "u-new", _record("u-new", "2026-01-02T00:00:00Z", EVENTS),
                EVENTS)  # fmt: skip
    latest = store.read("agents", "again")
    assert latest is not None and latest.uid == "u-new" and latest.events == EVENTS
    assert store.read("agents", "never") is None
    assert store.read("agents", "again", "u-missing") is None


def test_a_missing_record_means_not_archived_and_a_record_covers_its_own_events(
    s3: MotoS3,
) -> None:
    store = S3Archive(s3.url, "corral-archive", "us-east-1", s3.credentials)
    # A write cut between its two PUTs leaves a transcript and no record: not archived.
    store._put("agents/cut/u-9/events.jsonl", b'{"offset":0}\n', "application/x-ndjson")
    assert store.read("agents", "cut", "u-9") is None and store.read("agents", "cut") is None
    # A retry rewrites a longer transcript before its record: the old record reads its own.
    store.write("agents", "retry", "u-2", _record("u-2", "2026-01-01T00:00:00Z", EVENTS[:1]),
                EVENTS[:1])  # fmt: skip
    lines = "".join(json.dumps(e) + "\n" for e in EVENTS).encode()
    store._put("agents/retry/u-2/events.jsonl", lines, "application/x-ndjson")
    back = store.read("agents", "retry", "u-2")
    assert back is not None and back.events == EVENTS[:1]


def test_a_wrong_secret_is_refused_by_the_server_and_said_so(s3: MotoS3, tmp_path: Path) -> None:
    (tmp_path / "accessKeyId").write_text((s3.credentials / "accessKeyId").read_text())
    (tmp_path / "secretAccessKey").write_text("not-the-secret")
    store = S3Archive(s3.url, "corral-archive", "us-east-1", tmp_path)
    with pytest.raises(S3Error, match="403 SignatureDoesNotMatch"):
        store.write("agents", "fix-it", "u-3", _record("u-3", "x", []), [])
    # A rotated Secret is read on the next request, without a restart.
    (tmp_path / "secretAccessKey").write_text((s3.credentials / "secretAccessKey").read_text())
    store.write("agents", "fix-it", "u-3", _record("u-3", "x", []), [])
    assert store.read("agents", "fix-it", "u-3") is not None


def test_bad_configuration_and_names_are_refused_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an http"):
        S3Archive("s3.example.com", "b", "us-east-1", tmp_path)
    with pytest.raises(ValueError, match="bucket"):
        S3Archive("http://127.0.0.1:1", "", "us-east-1", tmp_path)
    store = S3Archive("http://127.0.0.1:1", "b", "us-east-1", tmp_path)
    with pytest.raises(ValueError, match="not a Kubernetes object name"):
        store.read("../etc", "x")
    with pytest.raises(S3Error, match="credentials are missing"):
        store.read("agents", "x")
    (tmp_path / "accessKeyId").write_text("k")
    (tmp_path / "secretAccessKey").write_text("s")
    with pytest.raises(S3Error, match="ConnectError"):  # nothing listens: an OSError, retried
        store.read("agents", "x", "u")


def test_both_backends_read_back_the_same_archive(s3: MotoS3, tmp_path: Path) -> None:
    record = _record("u-5", "2026-01-05T00:00:00Z", EVENTS)
    s3_store = S3Archive(s3.url, "corral-archive", "us-east-1", s3.credentials)
    stores: list[S3Archive | FileArchive] = [s3_store, FileArchive(tmp_path)]
    for store in stores:
        store.write("agents", "same", "u-5", record, EVENTS)
    read = [store.read("agents", "same") for store in stores]
    assert read[0] == read[1] and read[0] is not None


def test_the_operator_flags_choose_the_s3_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral_operator.archive.configure import archive_store
    from corral_operator.main import parse_args, settings_from

    base = ["--image", "i", "--namespace", "agents"]
    s3 = ["--archive-s3-endpoint", "http://127.0.0.1:9000", "--archive-s3-bucket", "audit",
          "--archive-s3-region", "eu-west-1", "--archive-s3-prefix", "prod",
          "--archive-s3-credentials-dir", str(tmp_path)]  # fmt: skip
    store = archive_store(settings_from(parse_args([*base, *s3])))
    assert isinstance(store, S3Archive)
    assert (store.bucket, store.region, store.prefix) == ("audit", "eu-west-1", "prod/")
    assert isinstance(archive_store(settings_from(parse_args([*base, "--archive-dir", "/a"]))),
                      FileArchive)  # fmt: skip
    assert archive_store(settings_from(parse_args(base))) is None
    for bad, why in (([*s3, "--archive-dir", "/a"], "not both"),
                     (s3[:2], "needs --archive-s3-bucket")):  # fmt: skip
        with pytest.raises(SystemExit):
            parse_args([*base, *bad])
        assert why in capsys.readouterr().err


def test_both_backends_keep_a_conversation_log_that_grows_in_chunks(
    s3: MotoS3, tmp_path: Path
) -> None:
    s3_store = S3Archive(s3.url, "corral-archive", "us-east-1", s3.credentials)
    stores: list[S3Archive | FileArchive] = [s3_store, FileArchive(tmp_path)]
    for store in stores:
        assert store.read_log("agents", "grows", "u-6") == (b"", 0)
        store.write_log("agents", "grows", "u-6", 0, 2, b'{"k":"sub"}\n{"k":"ev"}\n')
        store.write_log("agents", "grows", "u-6", 2, 3, b'{"k":"tx"}\n')
        store.write_log("agents", "grows", "u-6", 2, 3, b'{"k":"tx"}\n')  # a retry: read once
        store.write_log("agents", "grows", "u-6", 5, 6, b'{"k":"after a gap"}\n')
        data, after = store.read_log("agents", "grows", "u-6")
        assert (data, after) == (b'{"k":"sub"}\n{"k":"ev"}\n{"k":"tx"}\n', 3), store
        assert store.log_end("agents", "grows", "u-6") == 3  # from the names alone
        # The final archive of the run leaves the log where it is.
        store.write("agents", "grows", "u-6", _record("u-6", "2026-01-06T00:00:00Z", []), [])
        assert store.read_log("agents", "grows", "u-6")[1] == 3
        assert store.read("agents", "grows") is not None
    # A log past the read cap is refused, not read whole.
    big = FileArchive(tmp_path, max_bytes=200)
    big.write_log("agents", "grows", "u-7", 0, 1, b"x" * 150 + b"\n")
    big.write_log("agents", "grows", "u-7", 1, 2, b"y" * 150 + b"\n")
    with pytest.raises(ArchiveTooLarge):
        big.read_log("agents", "grows", "u-7")


def test_both_backends_keep_only_the_newest_work_in_progress_and_drop_it(
    s3: MotoS3, tmp_path: Path
) -> None:
    s3_store = S3Archive(s3.url, "corral-archive", "us-east-1", s3.credentials)
    stores: list[S3Archive | FileArchive] = [s3_store, FileArchive(tmp_path)]
    bundle = b"# v2 git bundle\n" + bytes(range(256)) * 4
    for store in stores:
        assert store.read_wip("agents", "mid", "u-8") is None
        store.drop_wip("agents", "mid", "u-8")  # nothing to drop is no error
        old = {"revision": "a" * 40, "base": "b" * 40, "bytes": 3, "savedAt": "t1"}
        store.write_wip("agents", "mid", "u-8", b"old", old)
        meta = {"revision": "c" * 40, "base": "b" * 40, "bytes": len(bundle), "savedAt": "t2"}
        store.write_wip("agents", "mid", "u-8", bundle, meta)
        assert store.read_wip("agents", "mid", "u-8") == (bundle, meta), store
        assert store.read_wip("agents", "mid", "u-9") is None  # another run of the name
        store.drop_wip("agents", "mid", "u-8")
        assert store.read_wip("agents", "mid", "u-8") is None
    # A bundle beside a description of another (a crash between the two writes) is not used.
    torn = FileArchive(tmp_path / "torn")
    torn.write_wip("agents", "mid", "u-8", bundle, {"revision": "c" * 40, "bytes": 7})
    assert torn.read_wip("agents", "mid", "u-8") is None
    assert list((tmp_path / "torn").glob("agents/mid/.wip-u-8/wip/mid.bundle"))
