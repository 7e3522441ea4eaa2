"""Files opened for writing on a FUSE mount: any write pattern, one upload of the whole file
per change, nothing uploaded for an unchanged or deleted file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.cacheserver.fuse import handles
from strata.cacheserver.fuse.handles import WriteHandle


class Uploads:
    """Records what commit() hands to the upload function, as the real one would send it."""

    def __init__(self) -> None:
        self.files: list[tuple[str, bytes, int]] = []

    def __call__(self, path: str, chunks: Iterator[bytes]) -> str:
        parts = list(chunks)
        self.files.append((path, b"".join(parts), len(parts)))
        return f"uploaded {path}"


@pytest.fixture
def uploads() -> Uploads:
    return Uploads()


def test_writes_at_any_offset_are_uploaded_as_one_file(tmp_path: Path, uploads: Uploads) -> None:
    h = WriteHandle("/d/f", str(tmp_path))
    assert h.write(b"hello world", 0) == 11
    h.write(b"HELLO", 0)           # seek back and rewrite
    h.write(b"!", 20)              # a hole is zeros
    assert h.size == 21
    assert h.read(100, 0) == b"HELLO world" + b"\0" * 9 + b"!"
    assert h.commit(uploads) == "uploaded /d/f"
    assert uploads.files == [("/d/f", b"HELLO world" + b"\0" * 9 + b"!", 1)]
    h.close()


def test_an_unchanged_file_is_not_uploaded_again(tmp_path: Path, uploads: Uploads) -> None:
    h = WriteHandle("/d/f", str(tmp_path))
    h.fill([b"existing"])
    assert h.commit(uploads) is None  # opened for writing, nothing written
    h.write(b"E", 0)
    h.commit(uploads)
    assert h.commit(uploads) is None  # flush, then release: one upload
    assert uploads.files == [("/d/f", b"Existing", 1)]
    h.close()


def test_created_and_truncated_files_are_uploaded_even_when_empty(tmp_path: Path, uploads: Uploads) -> None:
    created = WriteHandle("/d/new", str(tmp_path), dirty=True)
    created.commit(uploads)
    truncated = WriteHandle("/d/old", str(tmp_path))
    truncated.fill([b"0123456789"])
    truncated.truncate(4)
    truncated.commit(uploads)
    assert uploads.files == [("/d/new", b"", 0), ("/d/old", b"0123", 1)]
    created.close()
    truncated.close()


def test_a_discarded_file_is_never_uploaded(tmp_path: Path, uploads: Uploads) -> None:
    h = WriteHandle("/d/f", str(tmp_path), dirty=True)
    h.write(b"data", 0)
    h.discard()
    assert h.commit(uploads) is None
    assert uploads.files == []
    h.close()


def test_large_files_go_up_in_pieces_and_a_failed_upload_stays_dirty(tmp_path: Path, uploads: Uploads,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles, "UPLOAD_CHUNK", 1000)
    h = WriteHandle("/d/big", str(tmp_path))
    data = bytes(range(256)) * 10
    h.write(data, 0)

    def failing(path: str, chunks: Iterator[bytes]) -> str:
        next(chunks)
        raise ConnectionError("worker went away")

    with pytest.raises(ConnectionError):
        h.commit(failing)
    assert h.dirty
    h.commit(uploads)
    assert uploads.files == [("/d/big", data, 3)]
    h.close()


def test_the_spool_lives_in_the_spool_dir_and_leaves_no_file(tmp_path: Path) -> None:
    h = WriteHandle("/d/f", str(tmp_path))
    h.write(b"x" * 100, 0)
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing left behind by a crash
    h.close()
