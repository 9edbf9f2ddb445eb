"""moto's S3 server for the S3 archive's tests: a STAND-IN for S3 (moto is a mock, from the
dev extra), run with IAM authentication on (`INITIAL_NO_AUTH_ACTION_COUNT`) so that it checks
every request's SigV4 signature with botocore and refuses a wrong one with 403
SignatureDoesNotMatch. (This module holds no tests.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx

from corral_common import sigv4
from corral_dev.ports import free_port
from corral_operator.archive.s3 import S3Archive

# The first three requests moto takes without authentication: they make the archive's user.
UNAUTHENTICATED = 3


class MotoS3:
    def __init__(self, url: str, credentials: Path) -> None:
        self.url = url
        self.credentials = credentials


def _iam(url: str, host: str, params: list[tuple[str, str]]) -> str:
    """An IAM query call (moto routes it by the signature's service)."""
    body = "&".join(f"{k}={sigv4.uri_encode(v, keep_slash=False)}" for k, v in params).encode()
    stamp = sigv4.amz_date(datetime.now(UTC))
    headers = {"host": host, "x-amz-date": stamp,
               "content-type": "application/x-www-form-urlencoded"}  # fmt: skip
    headers["authorization"] = sigv4.authorization(
        "POST", "/", [], headers, sigv4.sha256_hex(body),
        credentials=sigv4.Credentials("AKIABOOTSTRAP", "bootstrap"),
        region="us-east-1", service="iam", amz_date=stamp,
    )  # fmt: skip
    answer = httpx.post(url + "/", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.text


@contextlib.contextmanager
def moto_s3(credentials: Path, bucket: str) -> Iterator[MotoS3]:
    """moto's S3 on a free loopback port with signature checking on, an IAM user allowed
    s3:* whose keys are written to `credentials` (as the chart's Secret mounts them), and
    `bucket` made."""
    port = free_port()
    server = Path(sys.executable).parent / "moto_server"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(UNAUTHENTICATED)}
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url, host = f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/moto-api/", timeout=1)  # not counted: moto's own API
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.1)
        version = ("Version", "2010-05-08")
        _iam(url, host, [("Action", "CreateUser"), ("UserName", "archiver"), version])
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        _iam(url, host, [("Action", "PutUserPolicy"), ("UserName", "archiver"),
                         ("PolicyName", "archive"), ("PolicyDocument", json.dumps(policy)),
                         version])  # fmt: skip
        made = _iam(url, host, [("Action", "CreateAccessKey"), ("UserName", "archiver"), version])
        creds = credentials
        key_id = re.search(r"<AccessKeyId>(.+?)</AccessKeyId>", made)
        secret = re.search(r"<SecretAccessKey>(.+?)</SecretAccessKey>", made)
        assert key_id and secret
        (creds / "accessKeyId").write_text(key_id.group(1) + "\n")
        (creds / "secretAccessKey").write_text(secret.group(1))
        maker = S3Archive(url, bucket, "us-east-1", creds)
        assert maker._request("PUT").status_code == 200  # make the bucket
        maker.close()
        yield MotoS3(url, creds)
    finally:
        proc.terminate()
        proc.wait(10)
