"""Hooks for every suite (unit, integration, e2e)."""

from __future__ import annotations

from typing import Any

# Byte strings longer than this are explained by where they first differ, not by a diff.
LONG_BYTES = 4096
WINDOW = 16


def first_difference(left: bytes, right: bytes) -> int:
    """The first offset at which `left` and `right` differ (the shorter one's length when
    one is a prefix of the other); -1 when they are equal."""
    for offset, (a, b) in enumerate(zip(left, right)):
        if a != b:
            return offset
    return -1 if len(left) == len(right) else min(len(left), len(right))


def explain_bytes(left: bytes, right: bytes) -> list[str]:
    offset = first_difference(left, right)
    lines = [f"{len(left)} bytes == {len(right)} bytes", f"first difference at offset {offset}"]
    lo = max(0, offset - WINDOW)
    lines.append(f"left[{lo}:{offset + WINDOW}] = {left[lo:offset + WINDOW]!r}")
    lines.append(f"right[{lo}:{offset + WINDOW}] = {right[lo:offset + WINDOW]!r}")
    return lines


def pytest_assertrepr_compare(op: str, left: Any, right: Any) -> list[str] | None:
    """A failed `==` of long byte strings (blocks, whole files) says where they part: pytest's
    own explanation runs difflib over every byte, minutes for a few MiB when CI=true turns its
    truncation off."""
    kinds = (bytes, bytearray, memoryview)
    if op == "==" and isinstance(left, kinds) and isinstance(right, kinds) and max(len(left), len(right)) > LONG_BYTES:
        return explain_bytes(bytes(left), bytes(right))
    return None
