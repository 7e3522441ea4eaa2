from __future__ import annotations

import pytest

from strata.contract.errors import InvalidArgument
from strata.contract.units import format_size, parse_duration, parse_size


@pytest.mark.parametrize("text,expected", [("16Mi", 16 << 20), ("1Gi", 1 << 30), ("1G", 10**9), ("512", 512),
                                           (" 2Ki ", 2048), ("1.5Gi", 3 << 29), (4096, 4096)])
def test_sizes(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["16MB", "-1Gi", "lots", "", True])
def test_bad_sizes_name_the_value(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="quota"):
        parse_size(bad, what="quota")  # type: ignore[arg-type]


@pytest.mark.parametrize("text,expected", [("30s", 30), ("1h30m", 5400), ("500ms", 0.5), ("0s", 0), ("0", 0),
                                           ("-1", -1), ("-1s", -1), ("24h", 86400), (15, 15)])
def test_durations(text: str | int, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["30x", "h", "1h30"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="ttl"):
        parse_duration(bad, what="ttl")


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 1024, 1536, 16 << 20, 3 << 30)] == ["0B", "1023B", "1KiB", "1.5KiB", "16MiB", "3GiB"]
