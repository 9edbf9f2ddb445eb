"""Which archive the operator writes to and people read from: a directory, an S3 bucket, or
none (docs/history.md)."""

from __future__ import annotations

from ..settings import OperatorSettings
from .s3 import S3Archive
from .store import ArchiveStore, FileArchive


def archive_store(settings: OperatorSettings) -> ArchiveStore | None:
    if settings.archive_s3_endpoint:
        if not settings.archive_s3_bucket or not settings.archive_s3_credentials_dir:
            raise ValueError("an S3 archive needs a bucket and a credentials directory")
        return S3Archive(
            settings.archive_s3_endpoint,
            settings.archive_s3_bucket,
            settings.archive_s3_region,
            settings.archive_s3_credentials_dir,
            prefix=settings.archive_s3_prefix,
            max_bytes=settings.max_history_bytes,
        )
    if settings.archive_dir:
        return FileArchive(settings.archive_dir, max_bytes=settings.max_history_bytes)
    return None
