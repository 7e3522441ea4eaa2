from __future__ import annotations

import gc
import random
import tracemalloc

from strata.cacheserver.common.keys import BlockKey
from strata.cacheserver.master.blocks import STEP, BlockIndex, Files
from strata.contract.proto import strata_pb2 as pb

MiB = 1 << 20
A_FILE = {"block_size": 4 * MiB, "file_length": 10 * MiB}  # the file the refs below are blocks of


def ref(path: str, index: int, *, mount: int = 1, version: str = "v1", length: int = 0) -> pb.BlockRef:
    """A block as a worker reports it: with its block size and length."""
    return pb.BlockRef(mount_id=mount, path=path, version=version, index=index, block_size=4 * MiB,
                       length=length or min(4 * MiB, 10 * MiB - index * 4 * MiB))


def key(path: str, index: int) -> BlockKey:
    return BlockKey.of_file(1, path, "v1", block_size=4 * MiB, file_length=10 * MiB, index=index)


def test_holders_and_sums_follow_reports() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0), ref("/d/a", 1), ref("/d/a", 2)])
    index.add("w1", [ref("/d/a", 0), ref("/e/b", 0, mount=2, length=5)])
    assert index.holders(key("/d/a", 0)) == {"w0", "w1"}
    assert index.cached_bytes_of_file(1, "/d/a", "v1", **A_FILE) == 10 * MiB  # copies count once
    assert index.cached_bytes_by_mount() == {1: 10 * MiB, 2: 5}  # so here too
    assert index.cached_bytes_by_worker(1) == {"w0": 10 * MiB, "w1": 4 * MiB}
    index.remove("w0", [ref("/d/a", 2)])
    assert index.cached_bytes_of_file(1, "/d/a", "v1", **A_FILE) == 8 * MiB
    index.drop_worker("w1")
    assert index.holders(key("/d/a", 0)) == {"w0"}
    assert index.cached_bytes_by_mount() == {1: 8 * MiB}
    assert index.cached_bytes_of_file(1, "/d/a", "v2", **A_FILE) == 0


def test_a_worker_reregistering_replaces_its_blocks() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0), ref("/d/a", 1)])
    index.drop_worker("w0")
    index.add("w0", [ref("/d/a", 1)])
    assert index.holders(key("/d/a", 0)) == set()
    assert index.holders(key("/d/a", 1)) == {"w0"}


def test_a_block_reported_with_another_length_is_another_block() -> None:
    """Same file version, block size and index, another length (a store that kept the
    version of a file whose size changed): neither answers for the other."""
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 2)])  # 2 MiB: the last block of a 10 MiB file
    short = BlockKey.of_file(1, "/d/a", "v1", block_size=4 * MiB, file_length=9 * MiB, index=2)
    assert index.holders(short) == set() and index.holders(key("/d/a", 2)) == {"w0"}
    index.add("w1", [ref("/d/a", 2, length=1 * MiB)])  # the newer report is the one kept
    assert index.holders(short) == {"w1"} and index.holders(key("/d/a", 2)) == set()
    assert index.cached_bytes_by_mount() == {1: 1 * MiB}
    assert index.cached_bytes_by_worker(1) == {"w1": 1 * MiB}
    index.remove("w1", [ref("/d/a", 2)])  # not the block it holds: nothing changes
    assert index.holders(short) == {"w1"}


def test_a_file_cut_with_another_block_size_is_not_counted() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0), ref("/d/a", 1)])
    assert index.cached_bytes_of_file(1, "/d/a", "v1", **A_FILE) == 8 * MiB
    assert index.cached_bytes_of_file(1, "/d/a", "v1", block_size=2 * MiB, file_length=10 * MiB) == 0
    assert index.cached_bytes_of_file(1, "/d/a", "v1", block_size=4 * MiB, file_length=0) == 0
    assert index.cached_bytes_of_file(2, "/d/a", "v1", **A_FILE) == 0  # another mount's file


def test_worker_and_mount_numbers_are_reused_without_mixing_holders() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0)])
    index.add("w1", [ref("/d/a", 0), ref("/e/b", 0, mount=2)])
    index.drop_worker("w0")
    index.remove("w1", [ref("/e/b", 0, mount=2)])
    index.add("w2", [ref("/d/a", 1), ref("/f/c", 0, mount=3)])  # w0's number, mount 2's number
    assert index.holders(key("/d/a", 0)) == {"w1"} and index.holders(key("/d/a", 1)) == {"w2"}
    assert index.cached_bytes_by_mount() == {1: 8 * MiB, 3: 4 * MiB}
    assert index.cached_bytes_by_worker(1) == {"w1": 4 * MiB, "w2": 4 * MiB}
    assert index.cached_bytes_by_worker(2) == {} and index.cached_bytes_by_worker(3) == {"w2": 4 * MiB}
    index.drop_worker("w-unknown")
    index.remove("w-unknown", [ref("/d/a", 0)])
    assert index.holders(key("/d/a", 0)) == {"w1"}


def test_the_index_answers_as_sets_of_holders_would_after_any_reports() -> None:
    """Random adds, removes and drops over a few files, against the plainest model."""
    rng = random.Random(27)
    files = [(mount, f"/m{mount}/f{n}", version) for mount in (1, 2) for n in range(4) for version in ("v1", "v2")]
    workers = [f"w{n}" for n in range(5)]
    index = BlockIndex()
    model: dict[tuple[tuple[int, str, str], int], set[str]] = {}
    for _ in range(1500):
        worker, op = rng.choice(workers), rng.random()
        if op < 0.03:
            index.drop_worker(worker)
            for holders in model.values():
                holders.discard(worker)
            continue
        blocks = [(rng.choice(files), rng.randrange(3)) for _ in range(rng.randrange(1, 4))]
        refs = [ref(f[1], i, mount=f[0], version=f[2]) for f, i in blocks]
        if op < 0.6:
            index.add(worker, refs)
            for b in blocks:
                model.setdefault(b, set()).add(worker)
        else:
            index.remove(worker, refs)
            for b in blocks:
                model.get(b, set()).discard(worker)
        held = {b: h for b, h in model.items() if h}
        for (mount, path, version), i in held:
            assert index.holders(BlockKey.of_file(mount, path, version, block_size=4 * MiB,
                                                  file_length=10 * MiB, index=i)) == held[((mount, path, version), i)]
        lengths = {b: min(4 * MiB, 10 * MiB - b[1] * 4 * MiB) for b in held}
        for mount in (1, 2):
            assert index.cached_bytes_by_mount().get(mount, 0) == sum(n for b, n in lengths.items() if b[0][0] == mount)
            assert index.cached_bytes_by_worker(mount) == {
                w: sum(n for b, n in lengths.items() if b[0][0] == mount and w in held[b])
                for w in workers if any(b[0][0] == mount and w in held[b] for b in held)}
        for f in files:
            assert index.cached_bytes_of_file(*f, **A_FILE) == sum(n for b, n in lengths.items() if b[0] == f)
    assert len(index) == len([b for b, h in model.items() if h])


def test_a_million_cached_blocks_take_under_200_bytes_each() -> None:
    """The master holds every cached block's holders: at a million blocks each byte a block is
    a megabyte. An object a block (its key, record, holder set and three indexes) cost ~1,230
    bytes; as one dict entry of two ints and a worker's journal entry, ~150 (bench/block_memory.py
    measures a million).
    Measured here at 50,000 blocks (where the dict's slack is at its largest) as a cluster
    reports them: most files of one block, some of a hundred; most blocks held once, one in ten
    twice."""
    blocks, long_files = 50_000, 50
    small_files = blocks - long_files * 100
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = BlockIndex()
        for worker in range(3):
            for start in range(0, blocks, 10_000):
                refs = []
                for n in range(start, start + 10_000):
                    if n % 3 != worker and not (n % 10 == 0 and (n + 2) % 3 == worker):
                        continue
                    if n < small_files:
                        refs.append(pb.BlockRef(mount_id=1_733_000_000_000_000 + n % 2, path=f"train/d{n // 1000:05d}/f{n % 1000:03d}.jpg",
                                                version=f"100000-{1_733_000_000_000_000_000 + n}", index=0,
                                                block_size=4 * MiB, length=100_000))
                    else:
                        f, i = divmod(n - small_files, 100)
                        refs.append(pb.BlockRef(mount_id=1_733_000_000_000_000, path=f"shards/s{f:05d}.tar",
                                                version=f"v-{f}", index=i, block_size=4 * MiB, length=4 * MiB))
                index.add(f"worker-{worker}", refs)
        del refs
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / blocks < 200, f"{held / blocks:.0f} bytes a block"
    assert len(index) == blocks
    assert index.holders(BlockKey(1_733_000_000_000_000, "train/d00000/f000.jpg", "100000-1733000000000000000", 0,
                                  4 * MiB, 100_000)) == {"worker-0", "worker-2"}


def test_files_kept_for_their_sums_are_summed_as_each_file_is() -> None:
    index = BlockIndex()
    index.add("w0", [ref("/d/a", 0), ref("/d/a", 2), ref("/e/b", 0, mount=2, length=5)])
    index.add("w1", [ref("/d/a", 2), ref("/d/c", 0, length=7)])
    files = Files()
    files.add(1, "/d/a", "v1", **A_FILE)
    files.add(2, "/e/b", "v1", block_size=4 * MiB, file_length=5)
    files.add(1, "/d/c", "v1", block_size=4 * MiB, file_length=8)  # the cached block is of another length
    files.add(1, "/d/empty", "v1", block_size=4 * MiB, file_length=0)
    assert index.cached_bytes_of(files) == 6 * MiB + 5 == sum(
        index.cached_bytes_of_file(m, p, "v1", block_size=4 * MiB, file_length=n)
        for m, p, n in ((1, "/d/a", 10 * MiB), (2, "/e/b", 5), (1, "/d/c", 8)))
    assert index.cached_bytes_of(Files()) == 0


def test_a_loads_files_take_under_32_bytes_each() -> None:
    """A finished load keeps its files for Report ("how much of it is still cached"): a
    FileEntry a file was ~400 bytes, a million-file load's ~400 MB for as long as it is kept."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        files = Files()
        for n in range(20_000):
            files.add(1_733_000_000_000_000, f"train/d{n // 1000:05d}/f{n % 1000:03d}.jpg", f"v-{n}",
                      block_size=4 * MiB, file_length=100_000 + n)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / len(files) < 32, f"{held / len(files):.0f} bytes a file"


def test_a_worker_caching_and_evicting_over_and_over_holds_no_more_memory() -> None:
    """Heartbeats add and remove the same blocks for as long as the cluster runs: what the
    index keeps to find a worker's blocks must follow the blocks it holds, not its history."""
    index = BlockIndex()
    index.add("w1", [ref("/d/a", 0)])
    churned = [ref("/d/a", i) for i in range(3)]
    tracemalloc.start()
    try:
        for _ in range(200):  # warm: the structures at their working size
            index.add("w0", churned)
            index.remove("w0", churned[1:])
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(2_000):
            index.add("w0", churned)
            index.remove("w0", churned[1:])
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4_000, f"{grown} bytes more after 4,000 blocks cached and evicted"
    index.drop_worker("w0")
    assert index.holders(key("/d/a", 0)) == {"w1"} and len(index) == 1


def test_a_block_held_by_more_workers_than_its_entry_has_lanes_names_each() -> None:
    """An entry names four holders; a block copied to more workers (a hot file spread wide)
    keeps the rest aside: each is named, counted and forgotten as the first four are."""
    index = BlockIndex()
    workers = [f"w{n}" for n in range(7)]
    for worker in workers:
        index.add(worker, [ref("/d/a", 0), ref("/d/a", 1)])
    assert index.holders(key("/d/a", 0)) == set(workers)
    index.remove("w1", [ref("/d/a", 0)])  # one of the first four: a later holder takes its place
    index.remove("w5", [ref("/d/a", 0)])  # one of the rest
    index.drop_worker("w0")
    assert index.holders(key("/d/a", 0)) == {"w2", "w3", "w4", "w6"}
    assert index.holders(key("/d/a", 1)) == set(workers) - {"w0"}
    assert index.cached_bytes_by_worker(1) == {"w1": 4 * MiB, "w5": 4 * MiB} | {
        w: 8 * MiB for w in ("w2", "w3", "w4", "w6")}
    index.add("w5", [ref("/d/a", 0)])
    for worker in ("w2", "w3", "w4", "w6"):
        index.drop_worker(worker)
    assert index.holders(key("/d/a", 0)) == {"w5"} and index.holders(key("/d/a", 1)) == {"w1", "w5"}
    assert index.cached_bytes_of_file(1, "/d/a", "v1", **A_FILE) == 8 * MiB
    index.drop_worker("w1")
    index.drop_worker("w5")
    assert len(index) == 0 and index.cached_bytes_by_mount() == {}


def test_a_worker_of_a_million_blocks_is_dropped_in_steps_and_its_slots_given_back() -> None:
    """A worker holding a million blocks expires: its blocks go STEP at a time (the master
    serves heartbeats and reads between steps, which see each block held or gone, never a
    wrong holder), and the table gives its slots back (a dict keeps its million)."""
    index = BlockIndex()
    index.add("w1", [ref(f"/d/f{n}", 0) for n in range(0, 3_000, 3)])
    small = index.slots()
    blocks = 1_000_000
    for start in range(0, blocks, 20_000):
        index.add("w0", [ref(f"/d/f{n}", 0) for n in range(start, start + 20_000)])
    assert len(index) == blocks and index.slots() > blocks
    steps = 0
    for _ in index.dropping("w0"):
        steps += 1
        index.add("w2", [ref(f"/e/f{steps}", 0)])  # a heartbeat between steps
        assert index.holders(key("/d/f3", 0)) == {"w1"}
    assert steps == blocks // STEP
    assert len(index) == 1_000 + steps
    assert index.slots() <= 2 * small
    assert index.cached_bytes_by_worker(1) == {"w1": 1_000 * 4 * MiB, "w2": steps * 4 * MiB}
    assert index.holders(key("/d/f4", 0)) == set() and index.holders(key("/d/f3", 0)) == {"w1"}
