"""What a worker knows about one cached block, kept on disk next to its bytes.

Each block file `<id>.blk` has a sidecar `<id>.meta` (small JSON) with the block's key,
length, tier, pin state, CRC-32C checksums of each 64 KiB chunk and its times. Both files are
written under a temporary name and renamed, the block first: after a crash a block without
its sidecar is an orphan, never a valid-looking partial block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.contract.constants import MEDIA
from strata.contract.errors import DataLoss, InvalidArgument
from ..common.checksums import CHUNK_SIZE, chunk_span, first_bad_chunk
from ..common.keys import BlockKey
from .files import write_atomically

# Format 3: the key carries the block size and length (format 2 keys did not, so a block
# cut with another block size could be taken for one of this size). CRC-32C (Castagnoli),
# computed by the CPU's crc32 instruction at over 10 GB/s, so verifying every read costs
# little next to copying the bytes. Sidecars of older formats are not read: their blocks
# count as orphans, are deleted by the scan and fetched again.
METADATA_FORMAT = 3


class BlockCorrupt(DataLoss):
    """A cached block's bytes are missing or fail their checksum. The block has been dropped
    from the cache; fetch it again from the store."""


@dataclass(slots=True)
class BlockMetadata:
    """The sidecar of one block. `pinned` and `last_access` change while it is cached."""

    key: BlockKey
    length: int
    medium: str
    checksums: tuple[int, ...]
    created: float
    last_access: float
    pinned: bool = False
    chunk_size: int = CHUNK_SIZE
    # last_access as last written to disk; not part of the file.
    persisted_access: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        if self.length != self.key.length:
            raise InvalidArgument(
                f"block {self.key}: sidecar says {self.length} bytes, its key {self.key.length}"
            )
        if self.medium not in MEDIA:
            raise InvalidArgument(f"block {self.key}: unknown medium {self.medium!r}")
        if self.chunk_size <= 0:
            raise InvalidArgument(f"block {self.key}: chunk size must be > 0, got {self.chunk_size}")
        expected = -(-self.length // self.chunk_size)
        if len(self.checksums) != expected:
            raise InvalidArgument(
                f"block {self.key}: {len(self.checksums)} checksums for {self.length} bytes, "
                f"expected {expected}"
            )

    # -- checksums --------------------------------------------------------------------------

    def chunk_span(self, offset: int, length: int) -> tuple[int, int]:
        """The chunk-aligned byte range [start, stop) that covers [offset, offset+length)."""
        return chunk_span(offset, length, self.chunk_size, self.length)

    def bad_chunk(self, data: bytes | memoryview, start: int) -> int | None:
        """Index of the first chunk of `data` (which begins at chunk-aligned offset `start`)
        whose CRC-32C is wrong, or None when all match."""
        return first_bad_chunk(data, start, self.checksums, self.chunk_size)

    # -- the sidecar file -------------------------------------------------------------------

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": METADATA_FORMAT,
                "key": self.key.to_dict(),
                "length": self.length,
                "medium": self.medium,
                "pinned": self.pinned,
                "chunk_size": self.chunk_size,
                "checksums": list(self.checksums),
                "created": self.created,
                "last_access": self.last_access,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BlockMetadata:
        """Parse a sidecar; InvalidArgument says what is wrong with it."""
        try:
            data: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"block metadata is not JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != METADATA_FORMAT:
            raise InvalidArgument(f"block metadata: unknown format {data!r:.80}")
        try:
            meta = cls(
                key=BlockKey.from_dict(data["key"]),
                length=_integer(data["length"]),
                medium=str(data["medium"]),
                checksums=tuple(_integer(c) for c in _sequence(data["checksums"])),
                created=float(data["created"]),
                last_access=float(data["last_access"]),
                pinned=bool(data["pinned"]),
                chunk_size=_integer(data["chunk_size"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidArgument):
                raise
            raise InvalidArgument(f"block metadata: bad or missing field {exc}") from exc
        meta.persisted_access = meta.last_access
        return meta

    def write(self, path: Path, *, durable: bool = False) -> None:
        write_atomically(path, self.to_json(), durable=durable)
        self.persisted_access = self.last_access

    @classmethod
    def read(cls, path: Path) -> BlockMetadata:
        return cls.from_json(path.read_bytes())


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _sequence(value: Any) -> Sequence[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r:.40}")
    return value
