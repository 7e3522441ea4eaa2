"""The node table of a FUSE mount, and its journal that a successor process replays."""

from __future__ import annotations

from pathlib import Path

from strata.cacheserver.fuse.nodes import NodeTable
from strata.cacheserver.fuse.wire import ROOT_ID


def test_a_path_keeps_its_id_until_the_kernel_forgets_every_lookup() -> None:
    table = NodeTable("/")
    a = table.lookup("/a")
    assert table.lookup("/a") == a and a != ROOT_ID and table.path(ROOT_ID) == "/"
    table.forget(a, 1)
    assert table.path(a) == "/a"
    table.forget(a, 1)
    assert table.path(a) is None and a not in table
    assert table.lookup("/a") != a  # a new node
    table.forget(ROOT_ID, 5)
    assert table.path(ROOT_ID) == "/"


def test_renames_move_the_node_and_everything_below_it() -> None:
    table = NodeTable("/")
    d, f, other = table.lookup("/d"), table.lookup("/d/f"), table.lookup("/e")
    table.rename("/d", "/e")  # replaces /e
    assert (table.path(d), table.path(f), table.path(other)) == ("/e", "/e/f", None)
    assert other in table  # the kernel still holds it until it forgets it
    new = table.lookup("/d")  # a new file where the old one was: a new id
    assert new not in (d, f, other)
    table.remove("/e/f")
    assert table.path(f) is None


def test_a_successor_replays_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "nodes.journal"
    table = NodeTable("/", journal)
    a, b = table.lookup("/a"), table.lookup("/a/b\nc")  # a store's key may hold a newline
    table.lookup("/a/b\nc")
    gone = table.lookup("/gone")
    table.forget_many([(gone, 1), (b, 1)])
    table.rename("/a", "/x y")
    unlinked = table.lookup("/u")
    table.remove("/u")
    ids = table.lookup("/next")
    with journal.open("a") as f:
        f.write("L 99")  # a line cut short by a crash: its change never reached the kernel

    successor = NodeTable("/", journal)
    assert successor.path(a) == "/x y" and successor.path(b) == "/x y/b\nc"
    assert gone not in successor and unlinked in successor and successor.path(unlinked) is None
    successor.forget(b, 1)
    assert b not in successor  # looked up twice, forgotten twice
    assert successor.lookup("/another") > ids  # new ids never reuse the predecessor's
    assert successor.lookup("/x y") == a


def test_the_journal_is_compacted(tmp_path: Path) -> None:
    journal = tmp_path / "nodes.journal"
    table = NodeTable("/", journal)
    keep = table.lookup("/keep")
    for i in range(30_000):
        table.forget(table.lookup(f"/t{i}"), 1)
    assert len(journal.read_text().splitlines()) < 25_000
    assert NodeTable("/", journal).path(keep) == "/keep"
