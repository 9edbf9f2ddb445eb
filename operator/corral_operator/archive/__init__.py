"""History that outlives the pod (docs/history.md): a Session's transcript, turn receipts and
final status, archived by the operator before its sandbox pod goes, and read back by people
through the operator's archive reader (`corral describe`, `corral logs`)."""

from .record import ARCHIVE_FORMAT, ArchivedSession, build_record, receipts_of
from .store import ArchiveStore, FileArchive

__all__ = [
    "ARCHIVE_FORMAT",
    "ArchiveStore",
    "ArchivedSession",
    "FileArchive",
    "build_record",
    "receipts_of",
]
