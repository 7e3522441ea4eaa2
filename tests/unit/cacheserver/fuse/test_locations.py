"""The `user.strata.locations` value: one line a scheduler can split, and parse back."""

from __future__ import annotations

import pytest

from strata.cacheserver.fuse.locations import BlockHosts, format_locations, parse_locations
from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb


def test_blocks_format_as_offset_length_and_hosts() -> None:
    blocks = [
        pb.BlockLocation(index=0, offset=0, length=4, hosts=["node-a", "node-b"]),
        pb.BlockLocation(index=1, offset=4, length=4, hosts=["node-b"]),
        pb.BlockLocation(index=2, offset=8, length=1, hosts=[]),
    ]
    text = format_locations(blocks)
    assert text == "0+4:node-a,node-b 4+4:node-b 8+1:"
    assert "\n" not in text
    assert parse_locations(text) == [BlockHosts(0, 4, ["node-a", "node-b"]), BlockHosts(4, 4, ["node-b"]),
                                     BlockHosts(8, 1, [])]


def test_an_empty_file_has_an_empty_value() -> None:
    assert format_locations([]) == ""
    assert parse_locations("") == []


@pytest.mark.parametrize("text", ["0-4:a", "0+4", "x+4:a", "0+:a"])
def test_malformed_values_are_refused_with_the_field(text: str) -> None:
    with pytest.raises(InvalidArgument, match="OFFSET\\+LENGTH:HOSTS"):
        parse_locations(text)
