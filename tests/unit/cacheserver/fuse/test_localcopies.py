"""The local copies a passthrough mount hands the kernel (fuse/localcopies.py), without a
mount: the kernel's registration of backing files is a counter here (the integration tests
in tests/integration/test_fuse_passthrough.py use the kernel's own)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from unittest import mock
from pathlib import Path

import pytest
from crc32c import crc32c

from strata.cacheserver.fuse import localcopies
from strata.cacheserver.fuse.localcopies import MIN_BYTES, LocalCopies, Pages, copy_name
from strata.contract.proto import strata_pb2 as pb

from tests.support.waiting import wait_until


class Kernel:
    """Backing ids given and let go of, as the connection's registry keeps them; the paths
    whose pages it was told to drop, and those open through its pages."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}  # id: the fd's inode
        self.next = 1
        self.lock = threading.Lock()
        self.dropped: list[str] = []
        self.open_through_pages: set[str] = set()

    def drop_pages(self, path: str) -> None:
        self.dropped.append(path)

    def reading_through_pages(self, path: str) -> bool:
        return path in self.open_through_pages

    def register(self, fd: int) -> int:
        with self.lock:
            backing_id, self.next = self.next, self.next + 1
            self.ids[backing_id] = os.fstat(fd).st_ino
            return backing_id

    def unregister(self, backing_id: int) -> None:
        with self.lock:
            self.ids.pop(backing_id, None)


class Store:
    """The bytes of each version, and whether this node holds them."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], bytes] = {}
        self.here: set[str] = set()
        self.asked = 0
        self.gaps_read = 0

    def add(self, path: str, version: str, data: bytes, *, here: bool = True) -> pb.FileInfo:
        self.data[(path, version)] = data
        if here:
            self.here.add(version)
        return pb.FileInfo(path=path, version=version, length=len(data))

    def read(self, info: pb.FileInfo, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
        data = self.data[(info.path, info.version)]
        for offset, length in ranges:
            self.gaps_read += length
            yield offset, data[offset:offset + length]

    def pages(self, info: pb.FileInfo, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, bytes]]:
        """The file's bytes as the kernel's reads of its page cache ask for them: 128 KiB at a time."""
        data = self.data[(info.path, info.version)]
        for offset in range(start, len(data) if stop is None else stop, 128 * 1024):
            yield offset, data[offset:offset + 128 * 1024]

    def held_here(self, info: pb.FileInfo) -> bool:
        self.asked += 1
        return info.version in self.here


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def kernel() -> Kernel:
    return Kernel()


def copies_in(tmp_path: Path, store: Store, kernel: Kernel, room: int = 64 * MIN_BYTES) -> LocalCopies:
    copies = LocalCopies(tmp_path / "copies", room, store.read, store.held_here, kernel.reading_through_pages)
    copies.attach(kernel.register, kernel.unregister, kernel.drop_pages, resumed=False)
    return copies


def read_through_page_cache(copies: LocalCopies, store: Store, info: pb.FileInfo, start: int = 0,
                            stop: int | None = None) -> None:
    """A file open through the page cache read (from `start` to `stop`) and closed."""
    for offset, data in store.pages(info, start, stop):
        copies.fill(info, offset, data)
    copies.read_done(info)


def within(folder: Path, count: int, room: int) -> bool:
    on_disk = list(folder.iterdir())
    return len(on_disk) <= count and sum(p.stat().st_size for p in on_disk) <= room


def open_through(copies: LocalCopies, info: pb.FileInfo, fh: int) -> int:
    """What an open passes through to (a backing id), 0 for the page cache; opened as `fh`."""
    copy = copies.usable(info)
    if copy is None:
        return 0
    copies.opened(fh, copy)
    return copy.backing_id


def until_passed_through(copies: LocalCopies, info: pb.FileInfo, fh: int) -> int:
    return wait_until(lambda: open_through(copies, info, fh), 10, f"{info.path} passed through")


def test_a_file_read_whole_is_copied_by_its_reads_and_registered_once_for_every_open(
        tmp_path: Path, store: Store, kernel: Kernel) -> None:
    data = os.urandom(3 * MIN_BYTES + 17)
    info = store.add("/a", "v1", data)
    copies = copies_in(tmp_path, store, kernel)
    assert open_through(copies, info, 2) == 0  # no copy yet: the page cache
    read_through_page_cache(copies, store, info)
    first = until_passed_through(copies, info, 4)
    assert store.asked == 0 and store.gaps_read == 0, "a file read whole needs nothing more"
    assert open_through(copies, info, 6) == first and list(kernel.ids) == [first]
    (path,) = (tmp_path / "copies").iterdir()
    assert path.name == f"{copy_name(info)}.{first}" and path.read_bytes() == data
    assert copies.passing("/a") == copy_name(info)
    for fh in (4, 6):
        copies.released(fh)
    assert copies.passing("/a") is None


def test_a_whole_copy_has_the_kernel_drop_the_files_pages_once_no_file_is_open_through_them(
        tmp_path: Path, store: Store, kernel: Kernel) -> None:
    """The next open passes through, and the kernel would drop them at that open, on the
    opener's time."""
    alone, shared = store.add("/a", "v1", os.urandom(2 * MIN_BYTES)), store.add("/b", "v1", os.urandom(2 * MIN_BYTES))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, alone)
    wait_until(lambda: kernel.dropped == ["/a"], 10, "the pages of /a dropped")
    kernel.open_through_pages.add("/b")  # another open of /b still reads through its pages
    read_through_page_cache(copies, store, shared)
    whole = tmp_path / "copies" / copy_name(shared)
    wait_until(whole.exists, 10, "the copy of /b whole")
    copies.read_done(alone)  # asked again for /a, after the copy of /b was made whole
    wait_until(lambda: kernel.dropped == ["/a", "/a"], 10, "the pages of /a dropped again")
    kernel.open_through_pages.discard("/b")  # pages a file is open through were kept; it closes
    copies.read_done(shared)
    wait_until(lambda: kernel.dropped == ["/a", "/a", "/b"], 10, "the pages of /b dropped at its close")


def test_a_read_of_a_file_passed_through_is_a_hint_given_to_its_copy(tmp_path: Path, store: Store,
                                                                   kernel: Kernel) -> None:
    """The kernel asks for such a read only for a readahead hint (posix_fadvise WILLNEED):
    the copy is what its reads will want, and nothing is fetched for its own page cache."""
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info)
    until_passed_through(copies, info, 4)
    assert not copies.read_ahead(2, 0, 4096), "a handle open through the page cache is read"
    hints: list[tuple[str, int, int]] = []
    fadvise = os.posix_fadvise

    def hinted(fd: int, offset: int, length: int, advice: int) -> None:
        hints.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        fadvise(fd, offset, length, advice)

    with mock.patch.object(os, "posix_fadvise", hinted):
        assert copies.read_ahead(4, MIN_BYTES, 1 << 20)
        (path,) = (tmp_path / "copies").iterdir()
        assert hints == [(str(path), MIN_BYTES, 1 << 20)]
        path.unlink()  # gone under it: still a hint, given to nothing
        assert copies.read_ahead(4, 0, 1 << 20) and len(hints) == 1
    assert store.gaps_read == 0


def test_an_open_waits_for_a_copies_disk_that_does_not_answer_once_and_then_not_at_all(
        tmp_path: Path, store: Store, kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of a copy at open runs on a thread of its own: a hung disk costs one open
    CHECK_WAIT, the next ones nothing (through the page cache), until the check ends."""
    monkeypatch.setattr(localcopies, "CHECK_WAIT", 0.3)
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info)
    wait_until((tmp_path / "copies" / copy_name(info)).exists, 10, "the copy of /a whole")
    answer = threading.Event()
    checked = copies._check_and_register
    monkeypatch.setattr(copies, "_check_and_register", lambda name, copy: answer.wait() and checked(name, copy))
    started = time.monotonic()
    assert open_through(copies, info, 2) == 0  # through the page cache, after CHECK_WAIT
    assert 0.3 <= time.monotonic() - started < 5
    started = time.monotonic()
    assert open_through(copies, info, 4) == 0 and time.monotonic() - started < 0.2  # no wait now
    answer.set()  # the disk answers again: the check ends, and the next open passes through
    assert until_passed_through(copies, info, 6)
    assert wait_until(lambda: copies._copies[copy_name(info)].opens == 1, 5, "only the passed-through open counted")


def slow_writes(monkeypatch: pytest.MonkeyPatch, go: threading.Event | None = None, pause: float = 0.0) -> None:
    """The copies' disk slow: each write waits for `go` (if given) and `pause` seconds."""
    write_all = localcopies._write_all

    def slow(fd: int, data: bytes | memoryview, offset: int) -> int:
        if go is not None:
            go.wait()
        time.sleep(pause)
        return write_all(fd, data, offset)

    monkeypatch.setattr(localcopies, "_write_all", slow)


def test_an_open_right_after_a_whole_read_waits_for_its_copy_and_passes_through(
        tmp_path: Path, store: Store, kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file read whole has every page given to its copy when the reader closes it; the next
    open (a second read of it at once) waits the fraction of a second their writes take and
    passes through, with the file's pages dropped already, instead of reading through them."""
    slow_writes(monkeypatch, pause=0.02)  # 16 writes: 0.3 s
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info)
    assert not (tmp_path / "copies" / copy_name(info)).exists()
    assert open_through(copies, info, 2), "the open waited for the copy"
    assert kernel.dropped == ["/a"]
    part = store.add("/b", "v1", os.urandom(2 * MIN_BYTES))
    read_through_page_cache(copies, store, part, 0, MIN_BYTES)  # its gaps are read at its close
    started = time.monotonic()
    assert open_through(copies, part, 4) == 0 and time.monotonic() - started < 0.2, "no wait for a copy in part"


def test_an_open_waits_for_a_copy_on_a_slow_disk_once(tmp_path: Path, store: Store, kernel: Kernel,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localcopies, "FINISH_WAIT", 0.3)
    go = threading.Event()
    slow_writes(monkeypatch, go)
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info)
    started = time.monotonic()
    assert open_through(copies, info, 2) == 0  # through the page cache, after FINISH_WAIT
    assert 0.3 <= time.monotonic() - started < 5
    started = time.monotonic()
    assert open_through(copies, info, 4) == 0 and time.monotonic() - started < 0.2  # no wait now
    go.set()
    assert until_passed_through(copies, info, 6)


def test_a_copys_pages_are_written_out_as_it_fills(tmp_path: Path, store: Store, kernel: Kernel,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Not left dirty for the kernel to write out later, under the reads that pass through
    to it, nor all at its end, which an open waiting for it would wait out."""
    monkeypatch.setattr(localcopies, "WRITE_OUT", MIN_BYTES)
    started: list[int] = []
    start_write_out = localcopies._start_write_out

    def recorded(fd: int) -> None:
        started.append(os.fstat(fd).st_size)
        start_write_out(fd)

    monkeypatch.setattr(localcopies, "_start_write_out", recorded)
    data = os.urandom(4 * MIN_BYTES)
    info = store.add("/a", "v1", data)
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info)
    until_passed_through(copies, info, 2)
    assert len(started) == 5  # each MiB, and the rest at its end
    (path,) = (tmp_path / "copies").iterdir()
    assert path.read_bytes() == data


def test_a_copy_written_in_order_has_its_pieces_summed_as_written_and_one_out_of_order_reads_them_back(
        tmp_path: Path, store: Store, kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CRC-32C a later check compares a copy with: summed from the bytes as they are
    written when they come in order (a file read front to back), so a whole copy is not read
    back under the reads that pass through to it; else read back once it is whole."""
    monkeypatch.setattr(localcopies, "PIECE", MIN_BYTES)
    read_back: list[str] = []
    take_pieces = LocalCopies._take_pieces

    def recorded(self: LocalCopies, name: str, copy: localcopies.Copy) -> None:
        read_back.append(copy.info.path)
        take_pieces(self, name, copy)

    monkeypatch.setattr(LocalCopies, "_take_pieces", recorded)
    in_order, out_of_order = (store.add(path, "v1", os.urandom(3 * MIN_BYTES + 17)) for path in ("/a", "/b"))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, in_order)
    for offset, data in reversed(list(store.pages(out_of_order))):
        copies.fill(out_of_order, offset, data)
    copies.read_done(out_of_order)
    for fh, info in enumerate((in_order, out_of_order), 2):
        until_passed_through(copies, info, fh)
        copy = copies._copies[copy_name(info)]
        wait_until(lambda: copy.pieces, 10, f"the pieces of {info.path}")
        data = store.data[(info.path, info.version)]
        assert copy.pieces == [crc32c(data[i:i + MIN_BYTES]) for i in range(0, len(data), MIN_BYTES)]
    assert read_back == ["/b"]


def test_a_file_read_in_part_has_the_rest_read_from_this_node_once_all_its_blocks_are_here(
        tmp_path: Path, store: Store, kernel: Kernel) -> None:
    data = os.urandom(4 * MIN_BYTES + 5)
    info = store.add("/a", "v1", data, here=False)
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info, MIN_BYTES, 2 * MIN_BYTES)
    wait_until(lambda: store.asked == 1, 10, "the master asked where /a's blocks are")
    for _ in range(5):  # not asked again at every close
        read_through_page_cache(copies, store, info, 0, 128 * 1024)
    time.sleep(0.2)
    assert store.asked == 1 and open_through(copies, info, 2) == 0 and store.gaps_read == 0
    store.here.add("v1")
    with mock.patch("strata.cacheserver.fuse.localcopies.ELSEWHERE_FOR", 0.0):
        read_through_page_cache(copies, store, info, 0, 128 * 1024)
        until_passed_through(copies, info, 4)
    assert store.gaps_read == len(data) - MIN_BYTES - 128 * 1024
    (path,) = (tmp_path / "copies").iterdir()
    assert path.read_bytes() == data


def test_a_small_file_is_not_copied(tmp_path: Path, store: Store, kernel: Kernel) -> None:
    small = store.add("/small", "s", os.urandom(MIN_BYTES - 1))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, small)
    assert open_through(copies, small, 2) == 0 and not list((tmp_path / "copies").iterdir())


def test_copies_stay_within_their_room_evicting_the_least_recently_opened(tmp_path: Path, store: Store,
                                                                         kernel: Kernel) -> None:
    infos = [store.add(f"/f{i}", f"v{i}", os.urandom(2 * MIN_BYTES)) for i in range(4)]
    copies = copies_in(tmp_path, store, kernel, room=5 * MIN_BYTES)  # two fit
    read_through_page_cache(copies, store, infos[0])
    held = until_passed_through(copies, infos[0], 2)  # kept open: never evicted
    for fh, info in enumerate(infos[1:], 10):
        read_through_page_cache(copies, store, info)
        until_passed_through(copies, info, fh)
        copies.released(fh)
        # (A copy evicted while it was filled leaves its file until the writing thread closes it.)
        wait_until(lambda: within(tmp_path / "copies", 2, 5 * MIN_BYTES), 10, "the copies within their room")
    assert held in kernel.ids and len(kernel.ids) == 2  # the evicted ones were let go of


def test_a_copy_written_to_is_read_back_and_removed_if_it_differs(tmp_path: Path, store: Store,
                                                                 kernel: Kernel) -> None:
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    copies = copies_in(tmp_path, store, kernel)
    read_through_page_cache(copies, store, info)
    backing_id = until_passed_through(copies, info, 2)
    copies.released(2)
    # (The CRC-32C of its pieces are taken after it is named; one changed before is dropped.)
    wait_until(lambda: all(c.pieces for c in copies._copies.values()), 10, "the pieces' CRC-32C taken")
    (path,) = (tmp_path / "copies").iterdir()
    with open(path, "r+b") as f:  # rewritten with the same bytes: read back, still sound
        head = f.read(10)
        f.seek(0)
        f.write(head)
    assert open_through(copies, info, 4) == backing_id
    copies.released(4)
    with open(path, "r+b") as f:
        f.seek(MIN_BYTES + 3)
        byte = f.read(1)
        f.seek(MIN_BYTES + 3)
        f.write(bytes([byte[0] ^ 1]))
    assert open_through(copies, info, 6) == 0
    assert not path.exists() and backing_id not in kernel.ids


def test_a_successor_lets_go_of_its_predecessors_ids_and_a_new_mount_only_removes_the_files(
        tmp_path: Path, store: Store, kernel: Kernel) -> None:
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    first = copies_in(tmp_path, store, kernel)
    read_through_page_cache(first, store, info)
    until_passed_through(first, info, 2)
    (tmp_path / "copies" / "left.tmp").write_bytes(b"partial")
    assert len(kernel.ids) == 1
    LocalCopies(tmp_path / "copies", MIN_BYTES * 8, store.read, store.held_here, kernel.reading_through_pages).attach(
        kernel.register, kernel.unregister, kernel.drop_pages, resumed=True)
    assert not kernel.ids and not list((tmp_path / "copies").iterdir())


def test_no_folder_means_no_copies(tmp_path: Path, store: Store, kernel: Kernel) -> None:
    info = store.add("/a", "v1", os.urandom(2 * MIN_BYTES))
    copies = LocalCopies(None, 8 * MIN_BYTES, store.read, store.held_here, kernel.reading_through_pages)
    copies.attach(kernel.register, kernel.unregister, kernel.drop_pages, resumed=False)
    read_through_page_cache(copies, store, info)
    assert not copies.wanted and open_through(copies, info, 2) == 0 and store.asked == 0


def test_the_pages_a_copy_has_are_a_bit_each_and_give_its_gaps_in_order() -> None:
    rng = random.Random(28)
    for _ in range(200):
        count = rng.randint(1, 300)
        pages, had = Pages(count), [False] * count
        for _ in range(rng.randint(0, 12)):
            first = rng.randint(0, count)
            last = rng.randint(first, count)
            assert pages.add(first, last) == sum(not had[i] for i in range(first, last))
            had[first:last] = [True] * (last - first)
        runs, page = [], 0
        while page < count:
            if had[page]:
                page += 1
                continue
            end = page
            while end < count and not had[end]:
                end += 1
            runs.append((page, end))
            page = end
        assert list(pages.missing()) == runs
    assert len(Pages(2**18)._bits) == 2**15  # 1 GiB of 4 KiB pages: 32 KiB
