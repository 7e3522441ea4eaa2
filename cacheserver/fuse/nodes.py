"""The node table of a FUSE mount: which namespace path each node id the kernel holds stands
for, and how many lookups of it the kernel has not yet forgotten.

The kernel names files by node id, Strata's operations by path. A node id is handed out at
the first lookup of a path and stays with the file through renames (a directory's renamed
children move with it); it is dropped when the kernel forgets it as often as it was looked
up. Ids are numbers from a counter, not a hash of the path: after `mv a b` the kernel still
holds a's node for b, and a new file at a needs a different id.

The table is bounded (`limit`, `strata fuse --max-nodes`): the kernel keeps a node for as long
as its entry stays in its cache, which only memory pressure ends, so a mount that has seen
many files would hold a node (and its status, see pins.py) for each. `over_limit` names the
least recently looked-up nodes past the bound; the session asks the kernel to drop their
entries (FUSE_NOTIFY_INVAL_ENTRY), and the kernel's FORGET frees them as for any node: a node
is never dropped while the kernel holds a lookup of it.

The table outlives the process serving the mount: every change is appended to a journal file
(one line per change, written before the kernel hears of it) that a successor replays (see
mountkeeper.py). The journal is rewritten compactly when it has grown well past the table.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..common.durable import write_file
from .wire import ROOT_ID


def _esc(path: str) -> str:
    """A path on one journal line (a store's keys may hold newlines)."""
    return path.replace("\\", "\\\\").replace("\n", "\\n")


def _unesc(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


# Rewrite the journal when it holds this many lines more than twice the table's size.
COMPACT_SLACK = 10_000


@dataclass(slots=True)
class Node:
    path: str | None  # None: removed (unlinked, or replaced by a rename) while the kernel holds it
    lookups: int


class NodeTable:
    """`limit`: nodes past which `over_limit` names some to drop (None: no bound)."""

    def __init__(self, root: str, journal: Path | None = None, *, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"a node table's limit must be at least 1 (or None), not {limit}")
        self.root = root
        self.limit = limit
        self._over_limit: Callable[[], None] = lambda: None  # see when_over_limit
        # In the order of their last lookup (a dict keeps the order of insertion: a node looked
        # up again is moved to the end), the least recent first.
        self._nodes: dict[int, Node] = {ROOT_ID: Node(root, 1)}
        self._ids: dict[str, int] = {root: ROOT_ID}
        self._next = ROOT_ID + 1
        self._lock = threading.Lock()
        self._journal = journal
        self._fd = -1
        self._lines = 0
        if journal is not None:
            if journal.exists():
                self._replay(journal.read_text(errors="surrogateescape"))
            self._rewrite()

    # -- queries ---------------------------------------------------------------------------------

    def path(self, nodeid: int) -> str | None:
        """The path of a node id the kernel holds (None: removed, or an id never given out)."""
        node = self._nodes.get(nodeid)
        return node.path if node is not None else None

    def __contains__(self, nodeid: object) -> bool:
        return nodeid in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def when_over_limit(self, callback: Callable[[], None]) -> None:
        """Call `callback` (quickly: under the table's lock) whenever a new node takes the table
        past its limit, whichever request looked it up."""
        self._over_limit = callback

    def over_limit(self, slack: int) -> list[tuple[int, str]]:
        """The nodes past the limit that the kernel should drop, and `slack` more (so the next
        ones are asked for in a batch, not one per lookup), the least recently looked up
        first, with their paths (the root and removed nodes stay). Each is counted as looked
        up now: if the kernel keeps it (an open file holds its entry), it is named again only
        after every other node."""
        if self.limit is None:
            return []
        with self._lock:
            excess = len(self._nodes) - self.limit
            if excess <= 0:
                return []
            chosen: list[tuple[int, str]] = []
            for nodeid, node in self._nodes.items():
                if len(chosen) >= excess + slack:
                    break
                if nodeid != ROOT_ID and node.path is not None:
                    chosen.append((nodeid, node.path))
            for nodeid, _ in chosen:
                self._nodes[nodeid] = self._nodes.pop(nodeid)
            return chosen

    def node_id(self, path: str) -> int | None:
        """The node id the kernel holds for `path`, if any."""
        return self._ids.get(path)

    # -- changes ---------------------------------------------------------------------------------

    def lookup(self, path: str) -> int:
        """The node id of `path`, counted as one more lookup the kernel holds."""
        with self._lock:
            nodeid = self._ids.get(path)
            if nodeid is None:
                nodeid = self._next
                self._next += 1
                node = self._nodes[nodeid] = Node(path, 0)
                self._ids[path] = nodeid
                if self.limit is not None and len(self._nodes) > self.limit:
                    self._over_limit()
            else:
                node = self._nodes[nodeid] = self._nodes.pop(nodeid)  # the most recent now
            node.lookups += 1
            self._touch_folders(path)
            self._log(f"L {nodeid} {_esc(path)}")
            return nodeid

    def forget(self, nodeid: int, count: int) -> None:
        with self._lock:
            self._forget(nodeid, count)
            self._log(f"F {nodeid} {count}")

    def forget_many(self, items: list[tuple[int, int]]) -> None:
        with self._lock:
            for nodeid, count in items:
                self._forget(nodeid, count)
            self._log("\n".join(f"F {nodeid} {count}" for nodeid, count in items))

    def remove(self, path: str) -> None:
        """`path` was unlinked or removed: its node (if the kernel holds one) has no path now."""
        with self._lock:
            self._remove(path)
            self._log(f"D {_esc(path)}")

    def rename(self, src: str, dst: str) -> None:
        """`src` is now `dst`, with everything below it; what was at `dst` is gone."""
        with self._lock:
            self._rename(src, dst)
            self._log(f"R {_esc(src)}\0{_esc(dst)}")

    # -- internals ---------------------------------------------------------------------------------

    def _touch_folders(self, path: str) -> None:
        """Count the folders above `path` as looked up now: the kernel holds each of them while
        it holds `path` (dropping a folder's entry would drop every entry below it)."""
        while path != self.root:
            path = path.rpartition("/")[0] or "/"
            nodeid = self._ids.get(path)
            if nodeid is None or nodeid == ROOT_ID:
                return
            self._nodes[nodeid] = self._nodes.pop(nodeid)

    def _forget(self, nodeid: int, count: int) -> None:
        node = self._nodes.get(nodeid)
        if node is None or nodeid == ROOT_ID:
            return
        node.lookups -= count
        if node.lookups <= 0:
            del self._nodes[nodeid]
            if node.path is not None and self._ids.get(node.path) == nodeid:
                del self._ids[node.path]

    def _remove(self, path: str) -> None:
        nodeid = self._ids.pop(path, None)
        if nodeid is not None and nodeid != ROOT_ID:
            self._nodes[nodeid].path = None

    def _rename(self, src: str, dst: str) -> None:
        self._remove(dst)
        prefix = src + "/"
        moved = [(p, i) for p, i in self._ids.items() if p == src or p.startswith(prefix)]
        for old, nodeid in moved:
            del self._ids[old]
        for old, nodeid in moved:
            new = dst + old[len(src):]
            self._remove(new)
            self._ids[new] = nodeid
            self._nodes[nodeid].path = new

    def _replay(self, text: str) -> None:
        for line in text.split("\n"):
            kind, _, rest = line.partition(" ")
            try:
                if kind == "N":  # a compacted node: id, lookups, path
                    nodeid_text, lookups, path = rest.split(" ", 2)
                    path = _unesc(path)
                    nodeid = int(nodeid_text)
                    self._nodes[nodeid] = Node(path or None, int(lookups))
                    if path:
                        self._ids[path] = nodeid
                    self._next = max(self._next, nodeid + 1)
                elif kind == "L":
                    nodeid_text, path = rest.split(" ", 1)
                    path = _unesc(path)
                    nodeid = int(nodeid_text)
                    node = self._nodes.setdefault(nodeid, Node(path, 0))
                    node.lookups += 1
                    node.path = path
                    self._ids[path] = nodeid
                    self._next = max(self._next, nodeid + 1)
                elif kind == "F":
                    nodeid_text, count = rest.split(" ", 1)
                    self._forget(int(nodeid_text), int(count))
                elif kind == "D":
                    self._remove(_unesc(rest))
                elif kind == "R":
                    src, dst = rest.split("\0", 1)
                    self._rename(_unesc(src), _unesc(dst))
            except ValueError:  # a line cut short by a crash mid-write: the change never reached the kernel
                continue
        self._nodes[ROOT_ID] = Node(self.root, 1)
        self._ids[self.root] = ROOT_ID

    def _rewrite(self) -> None:
        """Replace the journal by the table as it is now (under the lock, or before threads)."""
        assert self._journal is not None
        lines = [f"N {nodeid} {node.lookups} {_esc(node.path or '')}" for nodeid, node in self._nodes.items()
                 if nodeid != ROOT_ID]
        # Not fsynced, as the lines appended to it: a reboot ends the mount, and the table with it.
        write_file(self._journal, "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"),
                   sync_file=False, sync_folder=False)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self._journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._lines = len(lines)

    def _log(self, text: str) -> None:
        if self._fd < 0:
            return
        os.write(self._fd, (text + "\n").encode("utf-8", "surrogateescape"))
        self._lines += text.count("\n") + 1
        if self._lines > 2 * len(self._nodes) + COMPACT_SLACK:
            self._rewrite()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
