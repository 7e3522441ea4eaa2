"""Damage on disk, as a flipped bit or byte would make it: one byte of a file changed in place."""

from __future__ import annotations

from pathlib import Path


def flip_byte(path: Path, offset: int, mask: int = 0xFF) -> None:
    """XOR the byte at `offset` of the file at `path` with `mask`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))
