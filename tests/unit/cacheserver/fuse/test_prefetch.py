"""Folder listings fetched ahead of a walk: which folders are listed, and when a listing
fetched ahead is used (whole, reusable, not outlived) or not."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from strata.cacheserver.fuse.prefetch import FolderPrefetch
from strata.contract.errors import NotFound
from strata.contract.proto import strata_pb2 as pb


class Folders:
    """A tree the prefetch lists, recording what it was asked for (as ls_pages answers:
    pages of FileInfo, each entry reusable for `valid_for_ms`)."""

    def __init__(self, tree: dict[str, list[str]], *, valid_for_ms: int = 60_000, page: int = 2) -> None:
        self.tree = tree
        self.valid_for_ms = valid_for_ms
        self.page = page
        self.asked: list[str] = []
        self.listed = threading.Event()

    def info(self, path: str) -> pb.FileInfo:
        return pb.FileInfo(path=path, name=path.rsplit("/", 1)[1], is_dir=path in self.tree, length=len(path),
                           valid_for_ms=self.valid_for_ms)

    def ls_pages(self, folder: str, *, hold_reusable: bool = True) -> Iterator[list[pb.FileInfo]]:
        self.asked.append(folder)
        try:
            if folder not in self.tree:
                raise NotFound(f"no such folder {folder}")
            entries = [self.info(p) for p in self.tree[folder]]
            for at in range(0, len(entries), self.page):
                yield entries[at:at + self.page]
        finally:
            self.listed.set()


TREE = {"/r": ["/r/a", "/r/b", "/r/c", "/r/d", "/r/e"], "/r/a": ["/r/a/1", "/r/a/2", "/r/a/3"], "/r/b": ["/r/b/1"],
        "/r/c": ["/r/c/1"], "/r/d": ["/r/d/1"], "/r/e": []}


def prefetch(folders: Folders, **kwargs: int) -> FolderPrefetch:
    return FolderPrefetch(folders.ls_pages, enabled=True, wait=5.0, **kwargs)


def walked(ahead: FolderPrefetch, folders: Folders, ns: str) -> list[pb.FileInfo] | None:
    """What a readdir of `ns` gets ahead (None: it lists the folder itself, as here)."""
    taken = ahead.take(ns)
    got = taken[0] if taken is not None else None
    ahead.listed(ns, got if got is not None else [e for page in folders.ls_pages(ns) for e in page])
    return got


def test_a_walk_finds_each_next_folder_listed_ahead_with_every_entry() -> None:
    folders = Folders(TREE)
    ahead = prefetch(folders)
    assert walked(ahead, folders, "/r") is None  # the first is listed when read
    for folder in ["/r/a", "/r/b", "/r/c", "/r/d"]:
        got = walked(ahead, folders, folder)
        assert got is not None and [e.path for e in got] == TREE[folder], folder
    # an empty folder's listing says nothing of how long it holds: listed again when read
    assert walked(ahead, folders, "/r/e") is None
    # every other folder was listed once: ahead of the walk, never again by it
    assert folders.asked == ["/r", "/r/a", "/r/b", "/r/c", "/r/d", "/r/e", "/r/e"]


def test_a_listing_the_master_may_answer_otherwise_is_listed_again() -> None:
    folders = Folders(TREE, valid_for_ms=0)  # a writable mount: every answer asked for again
    ahead = prefetch(folders)
    walked(ahead, folders, "/r")
    assert walked(ahead, folders, "/r/a") is None
    assert folders.asked.count("/r/a") == 2


def test_a_listing_fetched_ahead_is_not_used_after_its_entries_expire() -> None:
    folders = Folders(TREE, valid_for_ms=1)
    ahead = prefetch(folders)
    walked(ahead, folders, "/r")
    folders.listed.wait(5)
    threading.Event().wait(0.05)
    assert walked(ahead, folders, "/r/a") is None


def test_a_folder_larger_than_the_bound_is_listed_when_read() -> None:
    folders = Folders(TREE)
    ahead = prefetch(folders, max_entries=2)
    walked(ahead, folders, "/r")
    assert walked(ahead, folders, "/r/a") is None  # 3 entries: more than 2
    got = walked(ahead, folders, "/r/b")
    assert got is not None and [e.path for e in got] == ["/r/b/1"]


def test_at_most_ahead_listings_are_held_and_a_change_forgets_them() -> None:
    folders = Folders(TREE)
    ahead = prefetch(folders, ahead=1)
    walked(ahead, folders, "/r")
    assert walked(ahead, folders, "/r/b") is None  # only /r/a was asked for ahead; now /r/c is
    ahead.clear()  # this mount changed something
    assert walked(ahead, folders, "/r/c") is None


def test_a_folder_gone_meanwhile_is_listed_by_the_reader() -> None:
    folders = Folders(TREE)
    ahead = prefetch(folders)
    gone = pb.FileInfo(path="/r/0", name="0", is_dir=True, valid_for_ms=60_000)  # listed, then removed
    ahead.listed("/r", [gone] + [folders.info(p) for p in TREE["/r"]])
    assert ahead.take("/r/0") is None  # NotFound ahead: the reader lists it and says so itself
    assert folders.asked[0] == "/r/0"


def test_no_listing_is_fetched_ahead_when_the_mount_reuses_no_metadata() -> None:
    folders = Folders(TREE)
    ahead = FolderPrefetch(folders.ls_pages, enabled=False, wait=5.0)
    ahead.listed("/r", [folders.info(p) for p in TREE["/r"]])
    assert ahead.take("/r/a") is None and folders.asked == []
