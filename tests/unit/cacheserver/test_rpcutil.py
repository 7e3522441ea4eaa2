"""Block lists travel in messages under the servers' receive limits."""

from __future__ import annotations

from strata.cacheserver import rpcutil
from strata.cacheserver.proto import strata_pb2 as pb


def test_block_lists_are_split_into_bounded_batches() -> None:
    refs = [pb.BlockRef(mount_id=1, path=f"/datasets/x/part-{i:06d}.parquet", version="e" * 32, index=i,
                        block_size=16 << 20, file_length=1 << 30, in_store=True, length=16 << 20) for i in range(100_000)]
    batches, rest = [], refs
    while rest:
        batch, rest = rpcutil.split_batch(rest)
        assert batch
        batches.append(batch)
    assert [r for b in batches for r in b] == refs
    assert len(batches) > 1
    for batch in batches:
        size = pb.RegisterWorkerRequest(blocks=batch).ByteSize()
        assert size <= rpcutil.BLOCK_LIST_BATCH_BYTES + 1024
        assert size < rpcutil.MASTER_MAX_RECEIVE_BYTES
    assert rpcutil.split_batch([]) == ([], [])
