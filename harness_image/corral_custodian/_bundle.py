"""A git bundle from the agent's side, read by the custodian before git reads it.

The harness has the tools side write a bundle of the session's commits and streams its bytes
here (`POST /agents/{conversation}/bundle`). The bytes are the agent's, so before any git
command sees them the custodian:

- writes them with `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600, into a fresh directory of its own,
  stopping at the size cap (`write_capped`; nothing beyond the cap is written);
- reads the header itself, bounded (`read_header`): v2 or v3 only, no capability but
  `@object-format=sha1` (a `@filter` bundle lacks objects by design), prerequisites and refs
  as 40-hex ids; the refs are parsed only to be ignored, the tip is the revision the harness
  names;
- walks the pack's entries (`scan_pack`) reading each object's declared size from its header
  (or its delta's target size) before inflating it, so an object over the blob limit, or a
  pack that would expand past its limit, is refused without inflating it; git's own
  `index-pack --strict` then checks that every declared size was true.

Errors: `BundleRefused(reason, detail)`, `reason` one of `_git.REASONS`.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAX_HEADER_BYTES = 1024 * 1024
# Each object costs git's index-pack memory, whatever its size; a real session's pack of new
# commits holds far fewer.
MAX_PACK_OBJECTS = 1_000_000
# What a pack may expand to, as a multiple of the bundle cap: source compresses a few times,
# a bomb thousands of times.
MAX_EXPANSION = 16

_SIGNATURES = {b"# v2 git bundle\n": 2, b"# v3 git bundle\n": 3}
_OID = re.compile(rb"^[0-9a-f]{40}$")
_CHUNK = 64 * 1024
_OFS_DELTA, _REF_DELTA = 6, 7
_BASE_TYPES = {1, 2, 3, 4}  # commit, tree, blob, tag


class BundleRefused(Exception):
    """The bundle is refused before git reads it; `reason` is from `_git.REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class BundleHeader:
    version: int
    prerequisites: tuple[str, ...]
    ref_count: int  # what the bundle names; never used as a ref
    pack_offset: int  # where the pack starts in the file


async def write_capped(chunks: AsyncIterator[bytes], path: Path, cap: int) -> int:
    """Write `chunks` to a new file `path` (never an existing one or through a symlink), mode
    0600; past `cap` bytes stop, remove the file and refuse. The number of bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in chunks:
                if written + len(chunk) > cap:
                    raise BundleRefused(
                        "bundle_too_large", f"the bundle is larger than {cap} bytes"
                    )
                out.write(chunk)
                written += len(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return written


def read_header(stream: BinaryIO) -> BundleHeader:
    """The bundle's header, read from the start of `stream` and at most MAX_HEADER_BYTES."""
    first = stream.readline(32)
    version = _SIGNATURES.get(first)
    if version is None:
        raise BundleRefused("bundle_invalid", "not a v2 or v3 git bundle")
    used = len(first)
    prerequisites: list[str] = []
    refs = 0
    while True:
        line = stream.readline(MAX_HEADER_BYTES - used + 1)
        used += len(line)
        if used > MAX_HEADER_BYTES:
            raise BundleRefused("bundle_invalid", f"the header is over {MAX_HEADER_BYTES} bytes")
        if not line.endswith(b"\n"):
            raise BundleRefused("bundle_invalid", "the header ends before its blank line")
        line = line[:-1]
        if not line:
            break
        if line.startswith(b"@"):
            if version < 3 or prerequisites or refs:
                raise BundleRefused("bundle_invalid", "a capability outside a v3 header")
            if line != b"@object-format=sha1":
                shown = line[:60].decode("ascii", "replace")
                raise BundleRefused(
                    "bundle_unsupported",
                    f"the capability {shown!r} is refused (a filtered bundle lacks objects; "
                    "only @object-format=sha1 is taken)",
                )
            continue
        if line.startswith(b"-"):
            oid = line[1:41]
            if not _OID.match(oid) or line[41:42] not in (b"", b" "):
                raise BundleRefused("bundle_invalid", "a prerequisite is not a 40-hex id")
            prerequisites.append(oid.decode())
            continue
        if not _OID.match(line[:40]) or line[40:41] != b" " or len(line) < 42:
            raise BundleRefused("bundle_invalid", "a header line is not a ref or a prerequisite")
        refs += 1
    return BundleHeader(version, tuple(prerequisites), refs, stream.tell())


class _Reader:
    """Buffered reads over the pack, with the inflation of one entry at a time."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._buf = bytearray()

    def _fill(self) -> bool:
        data = self._stream.read(_CHUNK)
        self._buf += data
        return bool(data)

    def take(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise BundleRefused("bundle_invalid", "the pack is truncated")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def rest(self) -> int:
        """How many bytes remain (reading them)."""
        while self._fill():
            if len(self._buf) > 64:
                break
        return len(self._buf)

    def inflate(self, declared: int, want_head: int) -> bytes:
        """Inflate one zlib stream, discarding its output but its first `want_head` bytes;
        refuse once it yields more than `declared` bytes."""
        inflater = zlib.decompressobj()
        head = bytearray()
        produced = 0
        while not inflater.eof:
            if inflater.unconsumed_tail:
                data = inflater.unconsumed_tail
            elif self._buf or self._fill():
                data = bytes(self._buf)
                self._buf.clear()
            else:
                data = b""  # the input is spent; zlib may still hold output
            try:
                out = inflater.decompress(data, _CHUNK)
            except zlib.error as e:
                raise BundleRefused("bundle_invalid", f"an object does not inflate: {e}") from e
            if not out and not data and not inflater.eof:
                raise BundleRefused("bundle_invalid", "the pack is truncated")
            produced += len(out)
            if produced > declared:
                raise BundleRefused("bundle_invalid", "an object is larger than it declares")
            if len(head) < want_head:
                head += out[: want_head - len(head)]
        self._buf[:0] = inflater.unused_data
        if produced != declared:
            raise BundleRefused("bundle_invalid", "an object is smaller than it declares")
        return bytes(head)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A delta header's size (little-endian base-128) at `at`: (value, next offset)."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise BundleRefused("bundle_invalid", "a delta's header is malformed")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def scan_pack(stream: BinaryIO, *, max_object_bytes: int, max_total_bytes: int) -> int:
    """Walk the pack at `stream`'s position: every object's size (a delta's target size) is
    at most `max_object_bytes`, all of them together at most `max_total_bytes`. The number of
    objects."""
    reader = _Reader(stream)
    magic = reader.take(12)
    if magic[:4] != b"PACK" or int.from_bytes(magic[4:8], "big") not in (2, 3):
        raise BundleRefused("bundle_invalid", "the bundle holds no version 2 or 3 pack")
    count = int.from_bytes(magic[8:12], "big")
    if count > MAX_PACK_OBJECTS:
        raise BundleRefused(
            "bundle_too_large", f"the pack holds {count} objects, over {MAX_PACK_OBJECTS}"
        )
    total = 0
    for _ in range(count):
        byte = reader.byte()
        kind = (byte >> 4) & 7
        size = byte & 0x0F
        shift = 4
        while byte & 0x80:
            if shift > 63:
                raise BundleRefused("bundle_invalid", "an object's header is malformed")
            byte = reader.byte()
            size |= (byte & 0x7F) << shift
            shift += 7
        if kind == _OFS_DELTA:
            while reader.byte() & 0x80:
                pass
        elif kind == _REF_DELTA:
            reader.take(20)
        elif kind not in _BASE_TYPES:
            raise BundleRefused("bundle_invalid", f"an object of unknown type {kind}")
        delta = kind in (_OFS_DELTA, _REF_DELTA)
        if not delta and size > max_object_bytes:
            raise BundleRefused(
                "object_too_large",
                f"an object of {size} bytes is over the limit of {max_object_bytes}",
            )
        head = reader.inflate(size, 20 if delta else 0)
        target = size
        if delta:
            _, at = _varint(head, 0)
            target, _ = _varint(head, at)
            if target > max_object_bytes:
                raise BundleRefused(
                    "object_too_large",
                    f"an object of {target} bytes is over the limit of {max_object_bytes}",
                )
        total += target
        if total > max_total_bytes:
            raise BundleRefused(
                "bundle_too_large", f"the pack expands to more than {max_total_bytes} bytes"
            )
    if reader.rest() != 20:
        raise BundleRefused("bundle_invalid", "the pack does not end with its checksum")
    return count
