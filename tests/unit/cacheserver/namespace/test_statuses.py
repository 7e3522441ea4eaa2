from __future__ import annotations

import gc
import tracemalloc

import pytest

from strata.cacheserver import heap
from strata.cacheserver.namespace.statuses import Folder, Statuses, Texts, find_listed
from strata.cacheserver.ufs import UfsStatus


def status(path: str, is_dir: bool = False) -> UfsStatus:
    return UfsStatus(path, is_dir, 0 if is_dir else len(path), 1_733_000_000_000 + len(path), "" if is_dir else f"v-{path}")


def test_statuses_give_back_what_they_were_given_and_find_by_path() -> None:
    given = [status("a", is_dir=True), status("a/1"), status("a/2"), status("b")]
    kept = Statuses(given)
    assert list(kept) == given and len(kept) == 4
    assert kept[1] == given[1] and kept[-1] == given[-1] and kept[1:3] == given[1:3]
    assert kept[0].is_dir is True and kept[1].name == "1"
    assert kept.find("a/2") == given[2] and kept.find("a/3") is None and kept.find("") is None
    assert find_listed(given, "a/2") == find_listed(kept, "a/2") == given[2]
    assert find_listed([], "a") is None and Statuses().find("a") is None


def test_statuses_leave_the_garbage_collector_nothing_to_look_at_per_file() -> None:
    gc.collect()
    before = len(gc.get_objects())
    kept = Statuses(status(f"d/{i:06d}") for i in range(10_000))
    gc.collect()
    assert len(gc.get_objects()) - before < 100  # the columns, not an object a file
    assert kept.find("d/004242") == status("d/004242")


def test_a_folder_of_a_walk_is_the_walks_entries_at_its_positions() -> None:
    walk = Statuses([status("a", is_dir=True), status("a/1"), status("a/2"), status("b")])
    folder = Folder(walk)
    for position in (1, 2):
        folder.append(position)
    assert list(folder) == [walk[1], walk[2]] and len(folder) == 2 and folder[-1] == walk[2]
    assert folder.find("a/2") == walk[2] and folder.find("b") is None and folder.find("a") is None
    assert find_listed(folder, "a/1") == walk[1] and folder[0:1] == [walk[1]]


def test_texts_give_back_each_string_they_were_given() -> None:
    texts = Texts()
    given = ["", "a", "dossier/été/ß.bin", "x" * 5000, "\udcff-raw"]  # the last: a name's undecodable byte
    for text in given:
        texts.append(text)
    assert list(texts) == given and len(texts) == 5
    assert texts[2] == given[2] and texts[-1] == given[-1] and texts[0] == "" and texts[1:3] == given[1:3]
    with pytest.raises(IndexError):
        texts[5]


def test_a_walks_statuses_hold_under_100_bytes_a_file() -> None:
    """The master keeps a walk's statuses for the mount's sync interval: at a million files
    each byte a file is a megabyte. Paths and versions as a store gives them (~20 and ~30
    characters) cost ~190 bytes a file as `str` objects; kept as bytes in shared buffers, ~70."""
    def walked() -> list[UfsStatus]:  # made anew each time: what a store's walk answers
        return [UfsStatus(f"t{i // 100_000:03d}/d{i // 1000 % 100:02d}/f{i % 1000:03d}.bin", False, 1024,
                          1_733_000_000_000 + i, f"1024-{1_733_000_000_000_000_000 + i}") for i in range(20_000)]

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = Statuses(walked())  # the walk's answer is gone once kept
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / len(kept) < 100, f"{held / len(kept):.0f} bytes a file"
    assert list(kept) == walked()


def test_trimming_the_heap_is_harmless_and_says_whether_it_could() -> None:
    assert heap.trim() in (True, False)
    assert heap.trim() is True  # this machine's C library is glibc
