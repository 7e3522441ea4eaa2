"""The master's answers a client holds: file statuses by path, to reuse while the master would
answer the same (FileInfo.valid_for_ms) and to go on with while it cannot be reached."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from strata.contract.proto import strata_pb2 as pb
from ..common.paths import parent


@dataclass(frozen=True)
class HeldAnswer:
    at: float  # time.monotonic() of the answer
    until: float  # time.monotonic() until which the master answers the same (the request's send time + valid_for)
    info: pb.FileInfo


def held_key(path: str) -> str:
    """The form of a path the master answers with ("a/b/" -> "/a/b")."""
    return "/" + path.strip("/")


class HeldAnswers:
    """Answers by path, at most `limit` (the least recently used go first), with the paths
    held below each folder indexed, so that forgetting a tree costs what it holds, not a scan
    of every answer (a rename or a recursive delete among 100,000 held files). Not
    thread-safe: the client holds its lock around each call."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._answers: OrderedDict[str, HeldAnswer] = OrderedDict()
        # folder -> the paths directly below it that are held or lead to one held
        self._below: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, path: str) -> HeldAnswer | None:
        return self._answers.get(path)

    def touch(self, path: str) -> None:
        """`path` was used: the last to go."""
        if path in self._answers:
            self._answers.move_to_end(path)

    def put(self, held: HeldAnswer) -> None:
        path = held.info.path
        self._answers[path] = held
        self._answers.move_to_end(path)
        self._link(path)
        while len(self._answers) > self.limit:
            gone, _ = self._answers.popitem(last=False)
            self._unlink(gone)

    def drop(self, path: str, *, below: bool = False, version: str | None = None) -> None:
        """Forget `path` (only an answer of `version`, if given) and, with `below`,
        everything held below it."""
        held = self._answers.get(path)
        if held is not None and (version is None or held.info.version == version):
            del self._answers[path]
        if below:
            folders = [path]
            while folders:
                folder = folders.pop()
                for child in self._below.pop(folder, ()):
                    self._answers.pop(child, None)
                    folders.append(child)
        self._unlink(path)

    def _link(self, path: str) -> None:
        while path != "/":
            up = parent(path)
            children = self._below.setdefault(up, set())
            if path in children:
                return
            children.add(path)
            path = up

    def _unlink(self, path: str) -> None:
        """Take `path` out of the index where nothing is held at or below it any more."""
        while path != "/" and path not in self._answers and not self._below.get(path):
            self._below.pop(path, None)
            up = parent(path)
            children = self._below.get(up)
            if children is None:
                return
            children.discard(path)
            path = up
