"""Sizes and durations as people write them in YAML: `16Mi`, `1Gi`, `30s`, `24h`."""

from __future__ import annotations

import re

from .errors import InvalidArgument

_SIZE_SUFFIXES = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")


def parse_size(value: str | int | float, *, what: str = "size") -> int:
    """Bytes in a Kubernetes quantity (`16Mi`, `1G`, `1048576`)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what}: expected a size such as 16Mi, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise InvalidArgument(f"{what}: must not be negative, got {value!r}")
        return int(value)
    match = _SIZE_RE.match(value)
    if not match:
        raise InvalidArgument(
            f"{what}: {value!r} is not a size; write a number with an optional suffix "
            "Ki, Mi, Gi, Ti (powers of 2) or k, M, G, T (powers of 10), e.g. 16Mi"
        )
    number, suffix = match.groups()
    return int(float(number) * _SIZE_SUFFIXES[suffix or ""])


def format_size(n: int | float) -> str:
    """A short human size: 0B, 1.5KiB, 16MiB, 2.0GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)}{unit}" if unit == "B" or value == int(value) else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_duration(value: str | int | float, *, what: str = "duration") -> float:
    """Seconds in a Go-style duration (`30s`, `1h30m`, `500ms`); plain numbers are seconds.
    `-1` (or `-1s`) is kept as -1: "never"."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what}: expected a duration such as 30s, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    if text in ("", "0"):
        return 0.0
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _DURATION_RE.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise InvalidArgument(
            f"{what}: {value!r} is not a duration; write e.g. 500ms, 30s, 5m, 24h or 1h30m"
        )
    return sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
