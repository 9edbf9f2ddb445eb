"""The archive in S3-compatible object storage: the same layout as the filesystem's, as keys.

    <prefix><namespace>/<session>/<uid>/events.jsonl
    <prefix><namespace>/<session>/<uid>/record.json

An object store has no rename, so the promise "a reader sees a whole archive or none" is kept
by order: each object is written whole by one PUT (S3 never shows half an object), the
transcript first and the record last, and a reader treats a missing record as "not archived".
A retry writes the transcript again before the record; the record says how many events it
covers and the reader takes that many, so a record never pairs with a longer transcript than
its own (the harness's history only grows).

Every answer is read as a stream with a cap: an object with the operator's read cap
(`--max-history-bytes`; `ArchiveTooLarge` past it, unread), a listing page or a refusal with
fixed small ones, so a misbehaving store cannot exhaust the operator's memory.

Requests are signed with SigV4 (`corral_common.sigv4`) over httpx and addressed path-style
(`<endpoint>/<bucket>/<key>`), which AWS and the S3-compatible servers (MinIO, Ceph RGW,
Garage, SeaweedFS, ...) all accept. The credentials are files the operator's pod mounts from a
Secret (the chart's `archive.s3.credentialsSecret`), read on each request so a rotated Secret
is used without a restart; no sandbox mounts them.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from corral_common import sigv4

from ..driver import byte_size
from .record import ArchivedSession
from .store import (
    DEFAULT_MAX_OBJECT_BYTES,
    ArchiveTooLarge,
    checked_names,
    joined_log,
    log_chain,
    log_chunk_name,
    wip_matches,
    wip_names,
)

ACCESS_KEY_FILE = "accessKeyId"
SECRET_KEY_FILE = "secretAccessKey"
SESSION_TOKEN_FILE = "sessionToken"  # optional: temporary credentials
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# A listing page holds at most 1,000 keys (about 1 MiB of XML with the longest keys); a refusal
# is shown as 200 characters of its message.
LISTING_READ_BYTES = 4 * 1024 * 1024
REFUSAL_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class Reply:
    """One answer of the object store, its body read up to a cap."""

    status_code: int
    content: bytearray


class S3Error(OSError):
    """The object store refused or could not be reached. An OSError, as a full volume is: the
    archive loop retries it and the reader answers 503 archive_unavailable."""


def read_credentials(directory: Path) -> sigv4.Credentials:
    try:
        key_id = (directory / ACCESS_KEY_FILE).read_text(encoding="utf-8").strip()
        secret = (directory / SECRET_KEY_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError as err:
        raise S3Error(f"the S3 credentials are missing: {err.filename}") from None
    token_file = directory / SESSION_TOKEN_FILE
    token = token_file.read_text(encoding="utf-8").strip() if token_file.exists() else None
    if not key_id or not secret:
        raise S3Error(f"the S3 credentials in {directory} are empty")
    return sigv4.Credentials(key_id, secret, token or None)


class S3Archive:
    """An `ArchiveStore` on one bucket of an S3-compatible object store."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        region: str,
        credentials_dir: str | Path,
        *,
        prefix: str = "",
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"the S3 endpoint {endpoint!r} is not an http(s) URL")
        if not bucket or "/" in bucket:
            raise ValueError(f"{bucket!r} is not a bucket name")
        self.endpoint = f"{parts.scheme}://{parts.netloc}"
        self.host = parts.netloc
        self.bucket = bucket
        self.region = region
        self.credentials_dir = Path(credentials_dir)
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.max_bytes = max_bytes
        # Identity only: a compressed answer could not be counted before it is inflated.
        self._http = httpx.Client(
            timeout=timeout, transport=transport, headers={"Accept-Encoding": "identity"}
        )

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------------ the protocol

    def _request(
        self,
        method: str,
        key: str = "",
        params: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        content_type: str | None = None,
        *,
        limit: int = REFUSAL_READ_BYTES,
        what: str = "",
    ) -> Reply:
        """The answer: a success's body read up to `limit` (ArchiveTooLarge past it, the rest
        never read), a refusal's first REFUSAL_READ_BYTES."""
        creds = read_credentials(self.credentials_dir)
        path = "/" + sigv4.uri_encode(self.bucket, keep_slash=False)
        if key:
            path += "/" + sigv4.uri_encode(key, keep_slash=True)
        params = params or []
        payload = sigv4.sha256_hex(body)
        stamp = sigv4.amz_date(datetime.now(UTC))
        headers = {"host": self.host, "x-amz-date": stamp, "x-amz-content-sha256": payload}
        if content_type:
            headers["content-type"] = content_type
        if creds.session_token:
            headers["x-amz-security-token"] = creds.session_token
        headers["authorization"] = sigv4.authorization(
            method, path, params, headers, payload,
            credentials=creds, region=self.region, service="s3", amz_date=stamp,
        )  # fmt: skip
        query = sigv4.canonical_query(params)
        url = f"{self.endpoint}{path}" + (f"?{query}" if query else "")
        try:
            with self._http.stream(method, url, content=body, headers=headers) as answer:
                return Reply(answer.status_code, _read_capped(answer, limit, what or key))
        except httpx.HTTPError as err:
            raise S3Error(f"S3 {method} {self.bucket}/{key}: {type(err).__name__}: {err}") from None

    @staticmethod
    def _refused(answer: Reply, what: str) -> S3Error:
        code = message = ""
        try:
            root = ET.fromstring(answer.content)
            code = root.findtext("Code") or ""
            message = root.findtext("Message") or ""
        except ET.ParseError:
            message = answer.content.decode("utf-8", errors="replace")[:200]
        return S3Error(f"S3 {what}: HTTP {answer.status_code} {code} {message}".strip())

    def _put(self, key: str, body: bytes, content_type: str) -> None:
        answer = self._request("PUT", key, body=body, content_type=content_type)
        if answer.status_code >= 300:
            raise self._refused(answer, f"PUT {key}")

    def _get(self, key: str, what: str) -> bytearray | None:
        answer = self._request("GET", key, limit=self.max_bytes, what=what)
        if answer.status_code == 404:
            return None
        if answer.status_code >= 300:
            raise self._refused(answer, f"GET {key}")
        return answer.content

    def _list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token = ""
        while True:
            params = [("list-type", "2"), ("prefix", prefix)]
            if token:
                params.append(("continuation-token", token))
            try:
                answer = self._request("GET", params=params, limit=LISTING_READ_BYTES)
            except ArchiveTooLarge:
                raise S3Error(
                    f"S3 list {prefix}: a page is larger than {byte_size(LISTING_READ_BYTES)}"
                ) from None
            if answer.status_code >= 300:
                raise self._refused(answer, f"list {prefix}")
            root = ET.fromstring(answer.content)
            keys += [el.text or "" for el in root.iter(f"{_S3_NS}Key")]
            keys += [el.text or "" for el in root.iter("Key")]  # servers without the namespace
            token = (
                root.findtext(f"{_S3_NS}NextContinuationToken")
                or root.findtext("NextContinuationToken")
                or ""
            )
            if not token:
                return keys

    # ------------------------------------------------------------------------ ArchiveStore

    def _key(self, namespace: str, name: str, uid: str, leaf: str) -> str:
        return f"{self.prefix}{namespace}/{name}/{uid}/{leaf}"

    def write(
        self, namespace: str, name: str, uid: str, record: dict[str, Any], events: list[Any]
    ) -> None:
        checked_names(namespace, name, uid)
        lines = "".join(
            json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in events
        )
        self._put(
            self._key(namespace, name, uid, "events.jsonl"),
            lines.encode("utf-8"),
            "application/x-ndjson",
        )
        # The record last: until it exists, readers see no archive of this run.
        self._put(
            self._key(namespace, name, uid, "record.json"),
            json.dumps(record, ensure_ascii=False, indent=1).encode("utf-8"),
            "application/json",
        )

    def read(self, namespace: str, name: str, uid: str | None = None) -> ArchivedSession | None:
        """The archive of that uid, or (no uid) of the run of this name archived last."""
        checked_names(namespace, name, uid)
        if uid is not None:
            return self._load(namespace, name, uid)
        runs = {
            key[len(self.prefix) :].split("/")[2]
            for key in self._list(f"{self.prefix}{namespace}/{name}/")
            if key.endswith("/record.json") and key.count("/") == self.prefix.count("/") + 3
        }
        loaded = [a for a in (self._load(namespace, name, run) for run in sorted(runs)) if a]
        if not loaded:
            return None
        return max(loaded, key=lambda a: str(a.record.get("archivedAt", "")))

    def write_log(
        self, namespace: str, name: str, uid: str, start: int, end: int, data: bytes
    ) -> None:
        checked_names(namespace, name, uid)
        leaf = f"conversation/{log_chunk_name(start, end)}"
        self._put(self._key(namespace, name, uid, leaf), data, "application/x-ndjson")

    def read_log(self, namespace: str, name: str, uid: str) -> tuple[bytes, int]:
        checked_names(namespace, name, uid)
        run = f"{namespace}/{name}/{uid}"
        prefix = self._key(namespace, name, uid, "conversation/")

        def reader(key: str) -> Callable[[], bytes]:
            return lambda: bytes(self._get(key, f"log of {run}") or b"")

        chunks = {key[len(prefix) :]: reader(key) for key in self._list(prefix)}
        return joined_log(chunks, self.max_bytes, f"conversation log of {run}")

    def log_end(self, namespace: str, name: str, uid: str) -> int:
        """The index after the archived log's last record, from one listing of its keys."""
        checked_names(namespace, name, uid)
        prefix = self._key(namespace, name, uid, "conversation/")
        chain = log_chain(key[len(prefix) :] for key in self._list(prefix))
        return chain[-1][1] if chain else 0

    def write_wip(
        self, namespace: str, name: str, uid: str, data: bytes, meta: dict[str, Any]
    ) -> None:
        checked_names(namespace, name, uid)
        bundle, described = wip_names(name)
        self._put(self._key(namespace, name, uid, bundle), data, "application/x-git-bundle")
        body = json.dumps(meta).encode()
        self._put(self._key(namespace, name, uid, described), body, "application/json")

    def read_wip(self, namespace: str, name: str, uid: str) -> tuple[bytes, dict[str, Any]] | None:
        checked_names(namespace, name, uid)
        bundle, described = wip_names(name)
        run = f"{namespace}/{name}/{uid}"
        meta = self._get(self._key(namespace, name, uid, described), f"wip of {run}")
        data = self._get(self._key(namespace, name, uid, bundle), f"wip of {run}")
        if meta is None or data is None:
            return None
        found = (bytes(data), dict(json.loads(meta)))
        return found if wip_matches(*found) else None

    def drop_wip(self, namespace: str, name: str, uid: str) -> None:
        checked_names(namespace, name, uid)
        for leaf in wip_names(name):
            answer = self._request("DELETE", self._key(namespace, name, uid, leaf))
            if answer.status_code >= 300 and answer.status_code != 404:
                raise self._refused(answer, f"DELETE {leaf}")

    def _load(self, namespace: str, name: str, uid: str) -> ArchivedSession | None:
        run = f"{namespace}/{name}/{uid}"
        raw = self._get(self._key(namespace, name, uid, "record.json"), f"record of {run}")
        if raw is None:
            return None
        record = json.loads(raw)
        text = self._get(self._key(namespace, name, uid, "events.jsonl"), f"transcript of {run}")
        if text is None:
            raise S3Error(f"the archive of {namespace}/{name}/{uid} has a record but no events")
        events = [json.loads(line) for line in text.decode("utf-8").splitlines() if line.strip()]
        count = int(record.get("events", len(events)))
        if len(events) < count:
            raise S3Error(f"the archive of {namespace}/{name}/{uid} lacks events its record names")
        return ArchivedSession(record, events[:count])


def _read_capped(answer: httpx.Response, limit: int, what: str) -> bytearray:
    """A streamed answer's body: a success's up to `limit` (ArchiveTooLarge past it, the rest
    unread), a refusal's first REFUSAL_READ_BYTES. Only identity-encoded bodies are read."""
    encoding = answer.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise S3Error(f"S3 answered {what} encoded ({encoding}); only identity is read")
    refusal = answer.status_code >= 300
    cap = REFUSAL_READ_BYTES if refusal else limit
    declared = answer.headers.get("content-length", "")
    if not refusal and declared.isdigit() and int(declared) > cap:
        raise ArchiveTooLarge(what, cap)
    body = bytearray()
    for chunk in answer.iter_bytes():
        if len(body) + len(chunk) > cap:
            if refusal:
                body += chunk[: cap - len(body)]
                break
            raise ArchiveTooLarge(what, cap)
        body += chunk
    return body
