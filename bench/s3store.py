"""The benchmark's object store: moto's S3 server (tests/support/s3server.py), with ranged
GETs that read only the range.

    python -P bench/s3store.py      # prints `PORT <n>`, serves on 127.0.0.1 until killed

moto answers a ranged GET by reading the whole object and slicing it, so one 16 MiB range of
a 1 GiB object costs a 1 GiB copy: the store, not the link, would set every number, and
small-block readers would pay more than large-block ones. A real store reads just the
range; this patch makes moto do the same (the object's spooled buffer is read at the
range's offset). Everything else is moto unchanged.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_ranged = threading.local()


class RangeView:
    """Stands in for an object's bytes while a single-range GET is answered: its length is
    the object's, and slicing it reads only that slice from the object's buffer."""

    def __init__(self, key: Any) -> None:
        self._key = key

    def __len__(self) -> int:
        return int(self._key.contentsize)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, item: slice) -> bytes:
        start, stop, _ = item.indices(len(self))
        with self._key.lock:
            self._key._value_buffer.seek(start)
            return bytes(self._key._value_buffer.read(max(0, stop - start)))


def patch_ranged_gets() -> None:
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    plain_value: Any = FakeKey.__dict__["value"]  # the property object itself
    plain_key_response = S3Response.key_response

    def value(self: Any) -> Any:
        if getattr(_ranged, "active", False):
            return RangeView(self)
        return plain_value.fget(self)

    def key_response(self: Any, request: Any, full_url: str, headers: dict[str, Any]) -> Any:
        header = request.headers.get("range", "")
        single = request.method == "GET" and header.startswith("bytes=") and "," not in header
        _ranged.active = single
        try:
            return plain_key_response(self, request, full_url, headers)
        finally:
            _ranged.active = False

    setattr(FakeKey, "value", property(value, plain_value.fset))
    setattr(S3Response, "key_response", key_response)


if __name__ == "__main__":
    sys.path.append(str(REPO / "tests" / "support"))  # not the repo root: operator/ would shadow the stdlib
    import s3server

    patch_ranged_gets()
    s3server._serve()
