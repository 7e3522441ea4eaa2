"""How the publisher decides a volume's mount is kept for a successor, and how its watch
retries a volume that fails (no FUSE here: the integration tests mount for real)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.cacheserver.csi import publisher as publisher_module
from strata.cacheserver.csi.publisher import Publication, Publisher
from strata.cacheserver.fuse import mountkeeper, settings


def record(target: Path, pid: int) -> Publication:
    return Publication(volume_id="vol-1", target=str(target), master="127.0.0.1:1", path="/data", read_only=True,
                       write_type="", pid=pid)


def test_a_record_of_an_earlier_plugin_without_passthrough_still_loads(publisher: Publisher, tmp_path: Path) -> None:
    target = tmp_path / "pod" / "mount"
    earlier = {k: v for k, v in dataclasses.asdict(record(target, 7)).items() if k != "passthrough"}
    publisher._files(str(target))[0].write_text(json.dumps(earlier))
    assert publisher.load(str(target)) == record(target, 7) and not record(target, 7).passthrough
    publisher._save(dataclasses.replace(record(target, 7), passthrough=True))
    assert publisher.load(str(target)).passthrough  # type: ignore[union-attr]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def publisher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Publisher:
    monkeypatch.setenv(settings.STATE_DIR_ENV, str(tmp_path / "fuse"))
    return Publisher(tmp_path / "state")


def test_a_mount_is_kept_only_when_its_server_is_gone_and_its_keeper_listens(
        publisher: Publisher, tmp_path: Path) -> None:
    target = tmp_path / "pod" / "mount"
    gone = record(target, dead_pid())
    assert not publisher._kept(gone)  # no keeper: a dead mount, to be mounted anew
    state = mountkeeper.state_dir(target)
    state.mkdir(parents=True)
    (state / mountkeeper.SOCKET).touch()
    assert publisher._kept(gone)
    with fake_server(target) as pid:
        assert not publisher._kept(record(target, pid))  # its server lives
        # A successor the keeper recorded serves it, though the record names the dead one.
        mountkeeper.write_json(state / mountkeeper.KEEPER, {"keeper_pid": 1, "server_pid": pid})
        assert not publisher._kept(gone)
        publisher._save(gone)
        publisher._recover(gone)  # adopts the successor: nothing started, nothing unmounted
        assert publisher.load(str(target)) == record(target, pid)
    assert publisher._kept(record(target, pid))  # and once that one is gone too, kept again
    assert not publisher._kept(None)


@contextlib.contextmanager
def fake_server(target: Path) -> Iterator[int]:
    """A live process whose command line names `fuse` and the target, as a volume's server's does."""
    serving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "fuse", str(target)])
    try:
        cmdline = Path(f"/proc/{serving.pid}/cmdline")
        while str(target).encode() not in cmdline.read_bytes():  # until it runs its own program
            time.sleep(0.01)
        yield serving.pid
    finally:
        serving.kill()
        serving.wait()


def test_the_watch_tries_a_failing_volume_again_less_and_less_often(
        publisher: Publisher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "pod" / "mount"
    publisher._save(record(target, dead_pid()))
    tries: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(publisher_module.time, "monotonic", lambda: clock[0])

    def recover(found: Publication) -> None:
        tries.append(clock[0])
        publisher._failed(found.target)

    monkeypatch.setattr(publisher, "_recover", recover)
    stop = threading.Event()
    waits = iter(range(40))

    def one_second_passes(timeout: float) -> bool:  # stands in for stop.wait(interval)
        clock[0] += 1.0
        return next(waits, None) is None

    monkeypatch.setattr(stop, "wait", one_second_passes)
    publisher.watch(stop)
    gaps = [later - earlier for earlier, later in zip(tries, tries[1:])]
    assert gaps[:4] == [2.0, 4.0, 8.0, 16.0] and max(gaps) <= publisher_module.RETRY_MAX, gaps

    # Unpublished meanwhile: the watch leaves the target alone.
    publisher._forget(str(target))
    tries.clear()
    waits = iter(range(5))
    publisher.watch(stop)
    assert tries == []
