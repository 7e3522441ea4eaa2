"""The value of the extended attribute `user.strata.locations`: which hosts hold each block
of a file, for schedulers (Spark, Dask, ...) that place tasks next to their data.

One line, one field per block, separated by single spaces; a field is
`OFFSET+LENGTH:HOST,HOST,...` (bytes of the file; hosts holding the block now, none when it is
not cached). A 9 MiB file with 4 MiB blocks, its first block on two nodes:

    0+4194304:node-a,node-b 4194304+4194304:node-b 8388608+1048576:

    $ getfattr -n user.strata.locations --only-values /mnt/strata/data/file.bin
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb


class BlockHosts(NamedTuple):
    offset: int
    length: int
    hosts: list[str]


def format_locations(blocks: Iterable[pb.BlockLocation]) -> str:
    return " ".join(f"{b.offset}+{b.length}:{','.join(b.hosts)}" for b in blocks)


def parse_locations(text: str) -> list[BlockHosts]:
    """The blocks of a `user.strata.locations` value (the inverse of format_locations)."""
    blocks = []
    for field in text.split():
        span, sep, hosts = field.partition(":")
        offset, plus, length = span.partition("+")
        if not (sep and plus and offset.isdigit() and length.isdigit()):
            raise InvalidArgument(f"{field!r} is not OFFSET+LENGTH:HOSTS (a block of {text!r})")
        blocks.append(BlockHosts(int(offset), int(length), [h for h in hosts.split(",") if h]))
    return blocks
