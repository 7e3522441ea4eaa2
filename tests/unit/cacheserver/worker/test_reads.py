"""BlockReads: what every transport serves a block from, against a real master and S3."""

from __future__ import annotations

import os

import pytest
from rangeproxy import RangeProxy

from strata.cacheserver.common.blockrefs import key_of
from strata.cacheserver.ufs import VersionChanged
from strata.contract.constants import MAX_READAHEAD_BLOCKS
from strata.contract.errors import DataLoss, FailedPrecondition
from strata.contract.proto import strata_pb2 as pb

from .conftest import BLOCK, Cluster, eventually, ref_for


def data_of(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


async def test_a_miss_is_fetched_from_the_store_and_the_next_read_is_a_hit(cluster: Cluster) -> None:
    await cluster.mount()
    data = data_of(2 * BLOCK + 100)
    cluster.put("m/a.bin", data)
    reads = (await cluster.worker()).reads
    info = await cluster.status("/m/a.bin")
    first = await reads.read_source(ref_for(info, 1), 0, offset=10, length=50, readahead=0, as_file=False)
    again = await reads.read_source(ref_for(info, 1), 0, offset=0, length=0, readahead=0, as_file=False)
    assert (first.hit, first.data) == (False, data[BLOCK + 10:BLOCK + 60])
    assert (again.hit, again.data) == (True, data[BLOCK:2 * BLOCK])
    assert (reads.counters.misses, reads.counters.hits, reads.counters.ufs_bytes_read) == (1, 1, BLOCK)
    assert reads.counters.bytes_served == 50 + BLOCK


async def test_a_file_source_is_the_block_file_at_the_asked_range(cluster: Cluster) -> None:
    await cluster.mount()
    data = data_of(BLOCK + 10, seed=3)
    cluster.put("m/f.bin", data)
    reads = (await cluster.worker()).reads
    info = await cluster.status("/m/f.bin")
    source = await reads.read_source(ref_for(info, 0), 0, offset=0, length=0, readahead=0)
    try:
        assert source.fd >= 0 and (source.offset, source.length) == (0, BLOCK)
        assert os.pread(source.fd, BLOCK, 0) == data[:BLOCK]
        assert source.checksums and source.chunk_size > 0
    finally:
        source.close()
    # A range off the file's chunks is served from the bytes checked in memory.
    ranged = await reads.read_source(ref_for(info, 0), 0, offset=100, length=200, readahead=0)
    assert (ranged.fd, ranged.data, ranged.length) == (-1, data[100:300], 200)


async def test_readahead_caches_the_next_blocks(cluster: Cluster) -> None:
    await cluster.mount()
    data = data_of(4 * BLOCK, seed=5)
    cluster.put("m/seq.bin", data)
    parts = await cluster.worker()
    info = await cluster.status("/m/seq.bin")
    await parts.reads.read_source(ref_for(info, 0), 0, offset=0, length=0, readahead=2, as_file=False)

    async def cached() -> bool:
        return all(parts.store.lookup(key_of(ref_for(info, i))) is not None for i in (1, 2))

    await eventually(cached, "blocks 1 and 2 read ahead")
    assert parts.store.lookup(key_of(ref_for(info, 3))) is None  # two ahead, no more


async def test_readahead_asked_for_is_bounded(cluster: Cluster) -> None:
    """One request may ask for any readahead (gRPC carries up to 2**32 - 1 blocks, the data
    port any number): it fetches at most MAX_READAHEAD_BLOCKS ahead, not every block of
    the file."""
    await cluster.mount()
    blocks = MAX_READAHEAD_BLOCKS + 20
    cluster.put("m/many.bin", data_of(blocks * BLOCK, seed=7))
    parts = await cluster.worker()
    info = await cluster.status("/m/many.bin")
    await parts.reads.read_source(ref_for(info, 0), 0, offset=0, length=1, readahead=2**32 - 1, as_file=False)

    async def settled() -> bool:
        return not parts.reads._readahead_pending  # every readahead this read started is done

    await eventually(settled, "the readahead done")
    cached = sorted(b.key.index for b in parts.store.blocks())
    assert cached == list(range(MAX_READAHEAD_BLOCKS + 1))


async def test_no_cache_reads_serve_the_store_bytes_and_keep_nothing(cluster: Cluster) -> None:
    await cluster.mount()
    data = data_of(BLOCK, seed=9)
    cluster.put("m/n.bin", data)
    parts = await cluster.worker()
    info = await cluster.status("/m/n.bin")
    source = await parts.reads.read_source(ref_for(info, 0), pb.NO_CACHE, offset=0, length=0, readahead=2)
    assert (source.fd, source.data, source.hit) == (-1, data, False)
    assert list(parts.store.blocks()) == []


async def test_a_block_named_with_another_version_is_refused_and_not_cached(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/v.bin", data_of(BLOCK))
    parts = await cluster.worker()
    info = await cluster.status("/m/v.bin")
    forged = ref_for(info, 0)
    forged.version = "not-the-version"
    with pytest.raises(FailedPrecondition, match="not-the-version"):
        await parts.reads.read_source(forged, 0, offset=0, length=0, readahead=0, as_file=False)
    assert list(parts.store.blocks()) == []


async def test_an_object_replaced_in_the_store_is_refused_not_cached_under_the_old_name(cluster: Cluster) -> None:
    await cluster.mount(metadata_sync_interval=-1)
    cluster.put("m/r.bin", data_of(BLOCK, seed=1))
    parts = await cluster.worker()
    info = await cluster.status("/m/r.bin")
    cluster.put("m/r.bin", data_of(BLOCK, seed=2))  # same length, new bytes and version
    with pytest.raises(VersionChanged):
        await parts.reads.read_source(ref_for(info, 0), 0, offset=0, length=0, readahead=0, as_file=False)
    assert list(parts.store.blocks()) == []
    # The master was told to look again: the next open names the store's new version.
    assert (await cluster.status("/m/r.bin")).version != info.version


async def test_a_damaged_block_file_is_dropped_and_fetched_again(cluster: Cluster) -> None:
    await cluster.mount()
    data = data_of(BLOCK, seed=11)
    cluster.put("m/d.bin", data)
    parts = await cluster.worker()
    info = await cluster.status("/m/d.bin")
    ref = ref_for(info, 0)
    await parts.reads.cache_blocks([ref])
    [block] = parts.store.blocks()
    block_file = next(p for p in (cluster.tmp / "w1" / "ssd").rglob("*") if p.is_file() and p.stat().st_size == BLOCK)
    damaged = bytearray(block_file.read_bytes())
    damaged[7] ^= 0xFF
    block_file.write_bytes(bytes(damaged))
    source = await parts.reads.read_source(ref, 0, offset=0, length=0, readahead=0, as_file=False)
    assert source.data == data
    assert parts.store.corrupt_blocks == 1 and parts.reads.counters.misses == 2
    assert block.key == key_of(ref)


async def test_a_short_circuit_recheck_verifies_the_whole_block_and_counts(cluster: Cluster) -> None:
    await cluster.mount()
    data = data_of(BLOCK, seed=13)
    cluster.put("m/s.bin", data)
    reads = (await cluster.worker()).reads
    info = await cluster.status("/m/s.bin")
    for verify in (False, True):
        source = await reads.short_circuit(ref_for(info, 0), 0, verify=verify)
        try:
            assert os.pread(source.fd, BLOCK, 0) == data
        finally:
            source.close()
    c = reads.counters
    assert (c.short_circuit_reads, c.short_circuit_rechecks, c.bytes_served) == (2, 1, 2 * BLOCK)


async def test_cache_blocks_counts_what_it_fetched(cluster: Cluster) -> None:
    await cluster.mount()
    cluster.put("m/l.bin", data_of(2 * BLOCK + 1))
    reads = (await cluster.worker()).reads
    info = await cluster.status("/m/l.bin")
    refs = [ref_for(info, i) for i in range(3)]
    assert await reads.cache_blocks(refs[:1]) == (BLOCK, BLOCK, BLOCK)
    assert await reads.cache_blocks(refs) == (2 * BLOCK + 1, BLOCK + 1, BLOCK + 1)


@pytest.mark.usefixtures("quick_retries")
async def test_a_store_answer_short_of_the_bytes_asked_is_never_served(cluster: Cluster,
                                                                      short_store: RangeProxy) -> None:
    """The store (through a proxy) answers every ranged read of the right version with a
    well-formed answer 100 bytes short: no read, cached or not, gets those bytes."""
    await cluster.mount(endpoint_url=short_store.endpoint_url)
    cluster.put("m/short.bin", data_of(2 * BLOCK))
    parts = await cluster.worker()
    info = await cluster.status("/m/short.bin")
    short_store.cut = 100
    for read_type in (pb.NO_CACHE, pb.CACHE):
        with pytest.raises(DataLoss, match=rf"bytes {BLOCK}-{2 * BLOCK - 1} .* with {BLOCK - 100} bytes, not {BLOCK}"):
            await parts.reads.read_source(ref_for(info, 1), read_type, offset=0, length=0, readahead=0,
                                          as_file=False)
    assert short_store.cut_answers > 2  # tried again before giving up: a cut answer may be the way's fault
    assert list(parts.store.blocks()) == []
    short_store.cut = 0
    source = await parts.reads.read_source(ref_for(info, 1), pb.NO_CACHE, offset=0, length=0, readahead=0)
    assert source.data == data_of(2 * BLOCK)[BLOCK:]


@pytest.mark.usefixtures("quick_retries")
async def test_a_copy_never_stages_a_store_answer_short_of_the_bytes_asked(cluster: Cluster,
                                                                          short_store: RangeProxy) -> None:
    """A copy to another mount reads the source's blocks from the store, uncached: an answer
    cut short fails the copy, rather than making a copy with bytes missing."""
    await cluster.mount(endpoint_url=short_store.endpoint_url)
    await cluster.mount("/other")
    data = data_of(2 * BLOCK + 10)
    cluster.put("m/src.bin", data)
    parts = await cluster.worker()
    short_store.cut = 100
    with pytest.raises(DataLoss, match=r"not 4096"):
        await parts.writes.copy_file(pb.CopyFileRequest(src="/m/src.bin", dst="/other/copy.bin",
                                                        write_type=pb.THROUGH))
    with pytest.raises(Exception, match="NoSuchKey|Not Found|404"):  # botocore's error
        cluster.get("other/copy.bin")
