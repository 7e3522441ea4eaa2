"""The name of a cached block: which mount, file, file version and block number."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..errors import InvalidArgument

# Hex digits of a block id: 128 bits keep collisions out of reach for any cache size.
BLOCK_ID_DIGEST_BYTES = 16


@dataclass(frozen=True)
class BlockKey:
    """One block of one version of a file under a mount.

    `version` is the file's version as the namespace reports it (etag, mtime or generation),
    so a changed file never matches blocks cached from its old content.
    """

    mount_id: int
    path: str
    version: str
    index: int

    def __post_init__(self) -> None:
        for name in ("mount_id", "index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"block key: {name} must be an integer >= 0, got {value!r}")
        for name in ("path", "version"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidArgument(f"block key: {name} must be a string, got {value!r}")
        if not self.path:
            raise InvalidArgument("block key: path must not be empty")

    @cached_property
    def block_id(self) -> str:
        """A stable hex digest of the key: the same on every worker and in every release,
        safe as a file name."""
        canonical = json.dumps(
            [self.mount_id, self.path, self.version, self.index],
            ensure_ascii=True,
            separators=(",", ":"),
        )
        return hashlib.blake2b(canonical.encode("ascii"), digest_size=BLOCK_ID_DIGEST_BYTES).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"mount_id": self.mount_id, "path": self.path, "version": self.version, "index": self.index}

    @classmethod
    def from_dict(cls, data: Any) -> BlockKey:
        if not isinstance(data, dict):
            raise InvalidArgument(f"block key: expected a mapping, got {type(data).__name__}")
        missing = [f for f in ("mount_id", "path", "version", "index") if f not in data]
        if missing:
            raise InvalidArgument(f"block key: missing field(s) {', '.join(missing)} in {data!r}")
        return cls(data["mount_id"], data["path"], data["version"], data["index"])

    def __str__(self) -> str:
        return f"{self.path}@{self.version or '-'}#{self.index} (mount {self.mount_id})"
