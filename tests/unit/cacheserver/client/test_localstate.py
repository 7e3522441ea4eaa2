"""The worker list one process of a host leaves for the next (a new process during a master outage)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from strata.cacheserver.client.localstate import WorkerRecord
from strata.contract.proto import strata_pb2 as pb


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STRATA_HOME", str(tmp_path))
    return tmp_path


def workers() -> list[pb.WorkerInfo]:
    return [pb.WorkerInfo(worker_id="w-0", address="10.0.0.1:29999", host="node-0", domain_socket="/run/s.sock")]


def test_a_new_process_reads_the_list_another_left_while_it_is_young_enough() -> None:
    WorkerRecord("master:19998").save(workers())
    loaded = WorkerRecord("master:19998").load(max_age=60)
    assert loaded is not None
    age, infos = loaded
    assert 0 <= age < 5 and infos == workers()
    assert WorkerRecord("another-master:19998").load(max_age=60) is None  # each master its own


def test_an_old_or_unreadable_record_is_no_record() -> None:
    record = WorkerRecord("master:19998")
    record.save(workers())
    data = json.loads(record.path.read_text())
    record.path.write_text(json.dumps({**data, "at": time.time() - 120}))
    assert record.load(max_age=60) is None
    record.path.write_text("not json")
    assert record.load(max_age=60) is None
    record.path.write_text(json.dumps({"at": time.time(), "workers": ["!!"]}))
    assert record.load(max_age=60) is None


def test_a_folder_that_cannot_be_written_is_no_error(home: Path) -> None:
    (home / "workers").write_text("a file where the folder would be")
    WorkerRecord("master:19998").save(workers())  # nothing kept, nothing raised
    assert WorkerRecord("master:19998").load(max_age=60) is None
