"""The name of a cached block: everything that decides its bytes.

A block holds bytes [index * block_size, index * block_size + length) of one version of a
file under a mount. Each of those six fields is part of the key, so two blocks that could
hold different bytes never share a name: a file that changed in the store (another
version), a cluster whose block size changed, or a request that asks for another length
gets another block, never an old one that happens to fit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from strata.contract.errors import InvalidArgument

# Hex digits of a block id: 128 bits keep collisions out of reach for any cache size.
BLOCK_ID_DIGEST_BYTES = 16
# Versions of files written into the cache (MUST_CACHE, ASYNC_THROUGH) start with this. While
# such a block is pinned, it is its file's only copy: not in the store yet.
WRITTEN_VERSION_PREFIX = "w-"

_FIELDS = ("mount_id", "path", "version", "index", "block_size", "length")


@dataclass(frozen=True)
class BlockKey:
    """One block of one version of a file under a mount, cut with one block size.

    `version` is the file's version as the namespace reports it (etag, mtime or generation),
    so a changed file never matches blocks cached from its old content. `length` is the
    block's byte count: `block_size`, or less for the last block of a file.
    """

    mount_id: int
    path: str
    version: str
    index: int
    block_size: int
    length: int

    @property
    def written(self) -> bool:
        """A block of a file written into the cache (not fetched from the store)."""
        return self.version.startswith(WRITTEN_VERSION_PREFIX)

    def __post_init__(self) -> None:
        for name in ("mount_id", "index", "length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"block key: {name} must be an integer >= 0, got {value!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size <= 0:
            raise InvalidArgument(f"block key: block_size must be an integer > 0, got {self.block_size!r}")
        if self.length > self.block_size:
            raise InvalidArgument(
                f"block key: length {self.length} is larger than the block size {self.block_size}"
            )
        for name in ("path", "version"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidArgument(f"block key: {name} must be a string, got {value!r}")
        if not self.path:
            raise InvalidArgument("block key: path must not be empty")

    @classmethod
    def of_file(
        cls, mount_id: int, path: str, version: str, *, block_size: int, file_length: int, index: int
    ) -> BlockKey:
        """Block `index` of a file of `file_length` bytes cut into `block_size` blocks."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise InvalidArgument(f"block size of {path} must be an integer > 0, got {block_size!r}")
        start = index * block_size
        if index < 0 or start >= file_length:
            blocks = -(-file_length // block_size)
            raise InvalidArgument(
                f"block {index} of {path} does not exist: the file has {file_length} bytes, "
                f"{blocks} block(s) of {block_size}"
            )
        length = min(block_size, file_length - start)
        return cls(mount_id, path, version, index, block_size, length)

    @property
    def offset(self) -> int:
        """Where the block starts in its file."""
        return self.index * self.block_size

    @cached_property
    def block_id(self) -> str:
        """A stable hex digest of the key: the same on every worker and in every release,
        safe as a file name."""
        canonical = json.dumps(
            [self.mount_id, self.path, self.version, self.index, self.block_size, self.length],
            ensure_ascii=True,
            separators=(",", ":"),
        )
        return hashlib.blake2b(canonical.encode("ascii"), digest_size=BLOCK_ID_DIGEST_BYTES).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: Any) -> BlockKey:
        if not isinstance(data, dict):
            raise InvalidArgument(f"block key: expected a mapping, got {type(data).__name__}")
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise InvalidArgument(f"block key: missing field(s) {', '.join(missing)} in {data!r}")
        return cls(*(data[f] for f in _FIELDS))

    def __str__(self) -> str:
        return (f"{self.path}@{self.version or '-'}#{self.index} ({self.length} bytes of a "
                f"{self.block_size}-byte block, mount {self.mount_id})")
