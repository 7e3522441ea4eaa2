from __future__ import annotations

import stat
from pathlib import Path

import pytest

from strata.cacheserver.namespace.statefile import StateFile, read_state, write_state
from strata.contract.errors import FailedPrecondition


def test_write_replaces_atomically_with_private_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    write_state(path, {"a": 1})
    write_state(path, {"a": 2})
    assert read_state(path) == {"a": 2}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]


def test_missing_file_reads_as_none_and_bad_files_are_reported(tmp_path: Path) -> None:
    assert read_state(tmp_path / "none.json") is None
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(FailedPrecondition, match="list.json does not hold a JSON object"):
        StateFile(tmp_path, "list.json").load()
    (tmp_path / "torn.json").write_text('{"a": ')
    with pytest.raises(FailedPrecondition, match="torn.json is not valid JSON"):
        StateFile(tmp_path, "torn.json").load()


def test_without_a_directory_nothing_is_kept() -> None:
    state = StateFile(None, "x.json")
    state.save({"a": 1})
    assert state.load() is None and state.path is None
