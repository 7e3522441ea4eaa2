"""Values by path that forget a whole tree at once: a cache of what was said about paths
(a client's held statuses, the FUSE mount's attributes, the namespace's store answers), with
an optional bound (the least recently used go first) and an optional time to live, and the
paths held below each folder indexed, so that forgetting a tree costs what is held in it, not
a scan of every entry (a rename or a recursive delete among 100,000 held paths). Paths are
`/`-separated, absolute ("/a/b", root "/") or relative to a root ("a/b", root "")."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

V = TypeVar("V")


def _parent(path: str) -> str | None:
    """The folder holding `path`: "/" for "/a", "" for "a"; None for a root ("/" or "")."""
    if path in ("", "/"):
        return None
    head, sep, _ = path.rpartition("/")
    if not sep:
        return ""
    return head or "/"


class PathMap(Generic[V]):
    """Values by path: at most `limit` (None: no bound; the least recently used go first,
    `touch` marks a use), each for `ttl` seconds after it was put (None: until forgotten;
    `clock` tells the time), with the paths below each folder indexed for `drop_below`. Not
    thread-safe: a user that shares one between threads holds its own lock around each call."""

    def __init__(self, *, limit: int | None = None, ttl: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"a PathMap's limit must be at least 1 (or None), not {limit}")
        self.limit = limit
        self.ttl = ttl
        self._clock = clock
        # path -> (value, time.monotonic() until which it is kept; inf: no time to live)
        self._values: OrderedDict[str, tuple[V, float]] = OrderedDict()
        # folder -> the paths directly below it that are held or lead to one held
        self._below: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._values)

    def holds(self, path: str) -> bool:
        """True if a value is held at or below `path` (its time up or not)."""
        return path in self._values or bool(self._below.get(path))

    def get(self, path: str) -> V | None:
        """The value held for `path`, None if there is none or its time is up (then it is
        forgotten)."""
        held = self._values.get(path)
        if held is None:
            return None
        value, until = held
        if until < self._clock():
            self.pop(path)
            return None
        return value

    def touch(self, path: str) -> None:
        """`path` was used: the last to go."""
        if path in self._values:
            self._values.move_to_end(path)

    def put(self, path: str, value: V) -> None:
        """Hold `value` for `path` (replacing what was held), the last to go; the least
        recently used go while more than `limit` are held."""
        self.put_many([(path, value)])

    def put_many(self, items: Iterable[tuple[str, V]]) -> None:
        """`put` of each of `items` in turn (a page of a listing), the bound kept once they
        are all in: what is held then is what one `put` after another leaves."""
        until = float("inf") if self.ttl is None else self._clock() + self.ttl
        values = self._values
        folder, below = None, None  # the folder of the path linked last, and its index
        for path, value in items:
            values[path] = (value, until)
            values.move_to_end(path)
            up = _parent(path)
            if below is not None and up == folder:
                below.add(path)  # its folder is linked already: the path before was in it
            else:
                self._link(path)
                folder, below = up, self._below.get(up) if up is not None else None
        while self.limit is not None and len(values) > self.limit:
            gone, _ = values.popitem(last=False)
            self._unlink(gone)

    def pop(self, path: str) -> V | None:
        """Forget `path` alone; what was held for it (None: nothing)."""
        held = self._values.pop(path, None)
        self._unlink(path)
        return None if held is None else held[0]

    def drop_below(self, path: str) -> int:
        """Forget everything held below `path` (not `path` itself); how many were held.
        Costs what is held there, whatever is held elsewhere."""
        dropped = 0
        folders = [path]
        while folders:
            for child in self._below.pop(folders.pop(), ()):
                if self._values.pop(child, None) is not None:
                    dropped += 1
                folders.append(child)
        self._unlink(path)
        return dropped

    def drop_tree(self, path: str) -> int:
        """Forget `path` and everything below it; how many were held."""
        dropped = 0 if self.pop(path) is None else 1
        return dropped + self.drop_below(path)

    def drop_ancestors(self, path: str) -> int:
        """Forget the folders above `path` (their values may show it, as a listing does); how
        many were held. Costs the path's depth."""
        popped = []
        up = _parent(path)
        while up is not None:
            if self._values.pop(up, None) is not None:
                popped.append(up)
            up = _parent(up)
        for folder in [path, *popped]:
            self._unlink(folder)
        return len(popped)

    def _link(self, path: str) -> None:
        up = _parent(path)
        while up is not None:
            children = self._below.setdefault(up, set())
            if path in children:
                return
            children.add(path)
            path, up = up, _parent(up)

    def _unlink(self, path: str) -> None:
        """Take `path` and the folders above it out of the index where nothing is held at or
        below them any more."""
        while path not in self._values and not self._below.get(path):
            self._below.pop(path, None)
            up = _parent(path)
            if up is None:
                return
            children = self._below.get(up)
            if children is None:
                return
            children.discard(path)
            path = up
