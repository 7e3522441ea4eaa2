"""The master's answers a client holds: file statuses by path, to reuse while the master would
answer the same (FileInfo.valid_for_ms) and to go on with while it cannot be reached."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from strata.contract.proto import strata_pb2 as pb
from ..common.pathmap import PathMap


class HeldAnswer(NamedTuple):  # a tuple: a listing holds one an entry, about twice as fast to make as a frozen dataclass
    at: float  # time.monotonic() of the answer
    until: float  # time.monotonic() until which the master answers the same (the request's send time + valid_for)
    info: pb.FileInfo


def held_key(path: str) -> str:
    """The form of a path the master answers with ("a/b/" -> "/a/b")."""
    return "/" + path.strip("/")


class HeldAnswers:
    """Answers by path, at most `limit` (the least recently used go first), forgetting a tree
    at the cost of what it holds (a PathMap). Not thread-safe: the client holds its lock
    around each call."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._answers: PathMap[HeldAnswer] = PathMap(limit=limit)

    def __len__(self) -> int:
        return len(self._answers)

    def holds(self, path: str) -> bool:
        """True if an answer is held at or below `path`."""
        return self._answers.holds(path)

    def get(self, path: str) -> HeldAnswer | None:
        return self._answers.get(path)

    def touch(self, path: str) -> None:
        """`path` was used: the last to go."""
        self._answers.touch(path)

    def put(self, held: HeldAnswer) -> None:
        self._answers.put(held.info.path, held)

    def put_many(self, helds: Iterable[HeldAnswer]) -> None:
        """`put` of each (a page of a listing), at the cost of one bound check."""
        self._answers.put_many((held.info.path, held) for held in helds)

    def drop(self, path: str, *, below: bool = False, version: str | None = None) -> None:
        """Forget `path` (only an answer of `version`, if given) and, with `below`,
        everything held below it."""
        held = self._answers.get(path)
        if held is not None and (version is None or held.info.version == version):
            self._answers.pop(path)
        if below:
            self._answers.drop_below(path)
