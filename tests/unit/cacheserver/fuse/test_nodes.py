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


def test_past_its_limit_the_table_names_the_least_recently_looked_up_nodes_to_drop() -> None:
    table = NodeTable("/", limit=4)  # the root counts
    d, a, b = table.lookup("/d"), table.lookup("/d/a"), table.lookup("/d/b")
    assert table.over_limit(slack=1) == []  # at the limit, not past it
    table.lookup("/d")  # looked up again: the most recent now
    c, gone = table.lookup("/c"), table.lookup("/gone")
    table.remove("/gone")  # held by the kernel with no path: nothing to name it by
    assert table.over_limit(slack=0) == [(a, "/d/a"), (b, "/d/b")]
    # Named ones count as looked up now: next time the others come first.
    assert table.over_limit(slack=1) == [(d, "/d"), (c, "/c"), (a, "/d/a")]
    table.forget_many([(a, 1), (b, 1), (gone, 1)])  # the kernel dropped them
    assert len(table) == 3 and table.over_limit(slack=5) == []  # the root and two nodes
    assert table.node_id("/d") == d and table.node_id("/d/a") is None
    assert NodeTable("/").over_limit(slack=5) == []  # no limit


def test_a_folder_is_as_recent_as_the_last_lookup_below_it() -> None:
    """The kernel holds a folder while it holds anything below it: dropping the folder's entry
    would drop the whole tree, so its files go first."""
    table = NodeTable("/", limit=2)
    d = table.lookup("/d")
    e, a, b = table.lookup("/d/e"), table.lookup("/d/e/a"), table.lookup("/d/e/b")
    assert table.over_limit(slack=0) == [(a, "/d/e/a"), (b, "/d/e/b"), (e, "/d/e")]
    assert d in table


def test_a_new_node_past_the_limit_is_told_whichever_request_looked_it_up() -> None:
    table = NodeTable("/", limit=2)
    told: list[int] = []
    table.when_over_limit(lambda: told.append(len(table)))
    table.lookup("/a")
    table.lookup("/a")  # not new
    assert told == []
    table.lookup("/b")
    table.lookup("/b")
    assert told == [3]
