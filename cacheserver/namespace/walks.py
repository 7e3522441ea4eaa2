"""A store's walk of a tree while it is under way: the statuses it has put into the columns so
far, which a recursive listing of the tree gives as they come instead of waiting for the end
(a walk of ten million files takes minutes), and which answer the listing of a folder the
walk has gone past.

A store's walk comes in path order (`Store.walk_pages`; S3's holds statuses back until no
folder still to come sorts before them): then every entry put in is where the finished walk
has it, and a folder the walk has gone past (its last entry sorts after the folder's whole
tree) is complete. From a walk that comes out of order after all (an S3 walk past the most it
holds back) nothing more is given before the end, when the walk is sorted; a listing that had
entries of it ends with an error that says to list again (the sorted walk answers then).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from strata.contract.errors import Unavailable
from ..ufs import UfsStatus
from .statuses import Folder, Prefix, Statuses

# The character after "/" in path order: every path below a folder `f` sorts between f + "/"
# and f + "0", and nothing else does.
_PAST_SLASH = chr(ord("/") + 1)


class Walk:
    """A walk of `rel` under way (see the module docstring): `statuses`, of which the first
    `given` are in their final place, and the task that ends with the walk's answer (the
    statuses, None: nothing at `rel`) or its error."""

    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.in_order = True
        self.statuses = Statuses()
        self.given = 0
        self._moved: asyncio.Future[None] | None = None

    def put(self, count: int) -> None:
        """The first `count` statuses are in place (called on the event loop after each page
        is packed); wakes the listings waiting for them."""
        if self.in_order and count > self.given:
            self.given = count
            self._wake()

    def out_of_order(self) -> None:
        """The store gave a path before one it gave earlier: nothing more is given before the
        walk is sorted at its end."""
        self.in_order = False

    def _wake(self) -> None:
        if self._moved is not None and not self._moved.done():
            self._moved.set_result(None)
        self._moved = None

    async def moved(self, answer: asyncio.Future[Any], given: int) -> None:
        """Wait until more than `given` statuses are in place or `answer` (the walk's task)
        is done, whichever comes first."""
        if self.given > given or answer.done():
            return
        if self._moved is None:
            self._moved = asyncio.get_running_loop().create_future()
        await asyncio.wait({self._moved, answer}, return_when=asyncio.FIRST_COMPLETED)

    async def entries(self, answer: asyncio.Future[Any]) -> AsyncIterator[Iterator[UfsStatus] | None]:
        """The walk's statuses in path order, in runs of those put in since the last run,
        each run given as soon as it is in place, and a None whenever the next is not (the
        taker may send what it holds); then the rest of the finished walk. The walk's error
        is raised where it happened. `answer` is the walk's task, whose result's first item
        is the walk's statuses (None: nothing at `rel`)."""
        sent = 0
        while not answer.done():
            if self.given > sent:
                given = self.given  # more may be put in while the taker takes this run
                yield _run(self.statuses, sent, given)
                sent = given
            elif not answer.done():
                yield None
                await self.moved(answer, sent)
        walked: Statuses | None = answer.result()[0]  # the walk's error, if it failed
        if walked is None:
            if sent:
                raise Unavailable(f"the walk of {self.rel!r} gave {sent} entries and then found nothing there")
            return
        if sent and walked is not self.statuses:
            raise Unavailable(f"the walk of {self.rel!r} came out of path order after {sent} entries were listed; "
                           "list it again (the finished walk is sorted)")
        if len(walked) > sent:
            yield _run(walked, sent, len(walked))

    def given_so_far(self) -> Prefix:
        """The statuses in their final place now."""
        return Prefix(self.statuses, self.given)

    def listing(self, folder: str) -> Folder | None:
        """The listing of `folder` (at or below this walk's `rel`) if the walk has gone past
        its whole tree, else None: the positions of its children among the statuses in
        place, found a child at a time (a child folder's tree is stepped over by bisection)."""
        given = self.given
        if not given or not folder:
            return None  # the root's tree is complete only when the walk is
        statuses = self.statuses
        if statuses.path_at(given - 1) < folder + _PAST_SLASH:
            return None  # not past the folder's tree yet
        listed = Folder(statuses)
        prefix = folder + "/"
        at = _position(statuses, prefix, given)
        while at < given:
            path = statuses.path_at(at)
            if not path.startswith(prefix):
                break
            name = path[len(prefix):]
            if "/" not in name:
                listed.append(at)
                at += 1
            else:  # below a child folder: step over that child's tree
                at = _position(statuses, prefix + name.split("/", 1)[0] + _PAST_SLASH, given)
        return listed


def _position(statuses: Statuses, path: str, end: int) -> int:
    """Where `path` is or would be among the first `end` statuses (by bisection)."""
    low, high = 0, end
    while low < high:
        middle = (low + high) // 2
        if statuses.path_at(middle) < path:
            low = middle + 1
        else:
            high = middle
    return low


def _run(statuses: Statuses, start: int, end: int) -> Iterator[UfsStatus]:
    at = statuses.at
    return (at(index) for index in range(start, end))
