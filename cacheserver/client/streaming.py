"""A file written as its writer goes: a WriteFile call that another thread feeds chunk by
chunk (what `fs.StrataFile` opened for writing sends its bytes through).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb
from ..common.paths import check_limits
from .core import StrataClient


class StreamingUpload:
    """A WriteFile call fed chunk by chunk from another thread (file objects opened for writing)."""

    _END = object()

    def __init__(self, client: StrataClient, path: str, write_type: pb.WriteType.ValueType, overwrite: bool,
                 append: bool = False) -> None:
        check_limits(path)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=8)
        self._result: pb.FileInfo | None = None
        self._error: BaseException | None = None

        def chunks() -> Iterator[bytes]:
            while (item := self._queue.get()) is not self._END:
                yield item  # type: ignore[misc]

        def run() -> None:
            try:
                self._result = client.write_file(path, chunks(), write_type=write_type, overwrite=overwrite,
                                                 append=append)
            except BaseException as exc:  # noqa: BLE001 - handed to the writer's thread
                self._error = exc
                while True:  # unblock a producer waiting on a full queue
                    try:
                        self._queue.get_nowait()
                    except queue.Empty:
                        break

        self._thread = threading.Thread(target=run, name=f"strata-upload-{path}", daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        while self._thread.is_alive():
            try:
                self._queue.put(data, timeout=0.5)
                return
            except queue.Full:
                continue
        if self._error is not None:
            raise self._error

    def finish(self) -> pb.FileInfo:
        if self._thread.is_alive():
            self._queue.put(self._END)
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise StrataError("write ended without a result")
        return self._result
