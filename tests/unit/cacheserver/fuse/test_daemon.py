"""`strata fuse` before it serves: the mount point it accepts, the kernel readahead it sets,
and what each bad argument or setting answers, all before anything is mounted (against a real
master in this process and a file:// mount). Mounting and serving run in
tests/integration/test_fuse*.py.

Where a test needs a mount this process cannot make (a live or stale Strata mount, a FUSE
connection in the mount table), the mount table's answer is a fake; the keeper of a kept
mount is a fake one on a real socket that hands over a pipe for the FUSE descriptor."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from threadmaster import MASTER_TOKEN, threaded_master

from strata.cacheserver.fuse import daemon, mountkeeper, settings
from strata.cacheserver.fuse.daemon import FuseOptions, prepare_mountpoint, raise_readahead, run_fuse
from strata.cacheserver.fuse.interface import MAX_IO
from strata.cacheserver.fuse.mountpoints import MountEntry, MountState, find_mount
from strata.cacheserver.client.fs import StrataFileSystem
from strata.contract.errors import AlreadyExists, InvalidArgument, NotFound
from strata.contract.proto import strata_pb2 as pb


def entry(mountpoint: Path, fstype: str = daemon.FSTYPE, device: str = "0:99") -> MountEntry:
    fields = {name: "" for name in MountEntry.__dataclass_fields__}
    return MountEntry(**{**fields, "mount_point": str(mountpoint), "fstype": fstype, "device": device,
                         "source": "strata:/"})


# -- the mount point ---------------------------------------------------------------------------


def test_a_missing_mount_point_or_a_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(InvalidArgument, match=f"mount point {missing} is not a directory; .*mkdir -p {missing}"):
        prepare_mountpoint(missing)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(InvalidArgument, match="is not a directory"):
        prepare_mountpoint(tmp_path / "file")


def test_a_relative_mount_point_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mnt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert prepare_mountpoint(Path("mnt")) == tmp_path / "mnt"


def test_a_live_mount_of_another_file_system_may_be_mounted_over() -> None:
    proc = Path("/proc")
    assert find_mount(proc) is not None
    assert prepare_mountpoint(proc) == proc


def test_a_live_strata_mount_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "mount_state", lambda path: MountState.LIVE)
    monkeypatch.setattr(daemon, "find_mount", lambda path: entry(tmp_path))
    with pytest.raises(AlreadyExists, match=f"{tmp_path} is already a Strata mount .*fusermount3 -u {tmp_path}"):
        prepare_mountpoint(tmp_path)


def test_a_stale_mount_is_unmounted_lazily_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unmounted: list[tuple[Path, bool]] = []
    monkeypatch.setattr(daemon, "mount_state", lambda path: MountState.STALE)
    monkeypatch.setattr(daemon, "unmount", lambda path, lazy=False: unmounted.append((path, lazy)))
    assert prepare_mountpoint(tmp_path) == tmp_path
    assert unmounted == [(tmp_path, True)]


# -- kernel readahead --------------------------------------------------------------------------


def test_readahead_is_raised_to_one_request_for_a_strata_mount_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bdi = tmp_path / "bdi"
    (bdi / "0:99").mkdir(parents=True)
    monkeypatch.setattr(daemon, "BDI", bdi)
    raise_readahead(tmp_path)  # not in the mount table (a real look): nothing written
    assert not (bdi / "0:99" / "read_ahead_kb").exists()
    monkeypatch.setattr(daemon, "find_mount", lambda path: entry(tmp_path, fstype="ext4"))
    raise_readahead(tmp_path)
    assert not (bdi / "0:99" / "read_ahead_kb").exists()
    monkeypatch.setattr(daemon, "find_mount", lambda path: entry(tmp_path))
    raise_readahead(tmp_path)
    assert (bdi / "0:99" / "read_ahead_kb").read_text() == str(MAX_IO // 1024)


def test_readahead_left_alone_without_sysfs_access_is_no_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "BDI", tmp_path / "no-such-folder")
    monkeypatch.setattr(daemon, "find_mount", lambda path: entry(tmp_path))
    raise_readahead(tmp_path)


# -- arguments and settings --------------------------------------------------------------------


@pytest.fixture(autouse=True)
def signal_mask() -> Iterator[None]:
    """run_fuse blocks the stop signals in the calling thread (its threads take them with
    sigwait): give the test's thread its mask back."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, before)


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv(settings.STATE_DIR_ENV, str(root))
    for name in (settings.HOLDER_ENV, settings.HOLDER_WAIT_ENV, settings.RESUME_TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture
def master(tmp_path: Path) -> Iterator[str]:
    """A real master whose mount /m is a folder holding the file f.bin."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "f.bin").write_bytes(b"data")
    with threaded_master(tmp_path) as (handle, _):
        address = f"127.0.0.1:{handle.port}"
        fs = StrataFileSystem(master=address, token=MASTER_TOKEN, skip_instance_cache=True)
        try:
            fs.client.mount("/m", f"file://{store}", pb.MountOptions())
        finally:
            fs.client.close()
        yield address


@pytest.fixture
def mountpoint(tmp_path: Path) -> Path:
    path = tmp_path / "mnt"
    path.mkdir()
    return path


def fuse(mountpoint: Path, master: str | None = None, **options: Any) -> int:
    return run_fuse(FuseOptions(mountpoint=mountpoint, **options), master=master, token=MASTER_TOKEN)


@pytest.mark.parametrize(("root", "why"), [("m", "must be absolute"), ("/../m", r"climbs above /")])
def test_a_bad_root_is_refused_before_anything_is_asked(
        mountpoint: Path, state_root: Path, root: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=f"--root .*{why}"):
        fuse(mountpoint, root=root)


def test_a_root_that_is_missing_or_a_file_is_refused_before_mounting(
        mountpoint: Path, state_root: Path, master: str) -> None:
    with pytest.raises(NotFound):
        fuse(mountpoint, master, root="/m/missing")
    with pytest.raises(InvalidArgument, match="--root /m/f.bin is a file; give a directory"):
        fuse(mountpoint, master, root="/m/f.bin")
    assert find_mount(mountpoint) is None


def test_fewer_than_one_reader_or_node_is_refused_before_mounting(
        mountpoint: Path, state_root: Path, master: str) -> None:
    with pytest.raises(InvalidArgument, match="--readers 0: give 1 or more"):
        fuse(mountpoint, master, root="/m", readers=0)
    with pytest.raises(InvalidArgument, match="--max-nodes 0: give 1 or more"):
        fuse(mountpoint, master, root="/m", max_nodes=0)
    assert find_mount(mountpoint) is None


def test_a_bad_holder_wait_is_refused_before_mounting(
        mountpoint: Path, state_root: Path, master: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.HOLDER_ENV, str(state_root / "holder.sock"))
    monkeypatch.setenv(settings.HOLDER_WAIT_ENV, "soon")
    with pytest.raises(InvalidArgument, match=f"{settings.HOLDER_WAIT_ENV} must be seconds .*not 'soon'"):
        fuse(mountpoint, master, root="/m")
    assert find_mount(mountpoint) is None


def test_a_kept_mount_is_resumed_only_with_the_options_it_was_mounted_with(
        mountpoint: Path, state_root: Path) -> None:
    """Checked before the master is asked anything: no master runs here."""
    state = mountkeeper.state_dir(mountpoint)
    state.mkdir(parents=True)
    mountkeeper.write_json(state / mountkeeper.SESSION, {"mountpoint": str(mountpoint), "root": "/other",
                                                         "read_only": True})
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(state / mountkeeper.SOCKET))
    listener.listen(1)
    hellos: list[dict[str, Any]] = []
    ended = threading.Event()

    def keeper() -> None:
        conn, _ = listener.accept()
        with conn:
            hellos.append(json.loads(conn.recv(65536)))
            read, write = os.pipe()
            socket.send_fds(conn, [json.dumps({"ok": True}).encode()], [read])
            os.close(read)
            os.close(write)
            conn.settimeout(10)
            while conn.recv(65536):  # signs of life, until the server lets go
                pass
            ended.set()

    thread = threading.Thread(target=keeper, daemon=True)
    thread.start()
    try:
        with pytest.raises(InvalidArgument, match=f"{mountpoint} is kept mounted with --root /other --read-only; "
                                                  "resume it with the same options"):
            fuse(mountpoint, root="/m")
        assert ended.wait(10), "the server kept the keeper's connection"
        assert hellos[0]["pid"] == os.getpid()
    finally:
        listener.close()
        thread.join(timeout=10)
