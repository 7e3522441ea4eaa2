"""The fsspec filesystem (client/fs.py) as pandas, pyarrow and dask use it, against real server
parts in this process: a real master and a real worker (gRPC, data port and short-circuit
socket on 127.0.0.1, a block store on a tmp folder) on one event loop thread, a file:// mount
of a folder here. No fake: the answers are the servers' own. Open modes, reads of ranges
across blocks, ls/info/find answers, listings that changes made through the same object
drop, and server errors raised as the Python exceptions callers catch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from threadmaster import MASTER_TOKEN, threaded_master

from strata.cacheserver.auth import Credentials
from strata.cacheserver.client.fs import StrataFileSystem
from strata.cacheserver.worker.membership import WorkerIdentity
from strata.cacheserver.worker.server import start_worker
from strata.contract.config import ServerConfig
from strata.contract.proto import strata_pb2 as pb

MiB = 1 << 20


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[StrataFileSystem, Path]]:
    """A filesystem object of a cluster of one master and one worker whose mount /m is the
    folder `store` here (its metadata looked up on every access)."""
    store = tmp_path / "store"
    store.mkdir()
    with threaded_master(tmp_path) as (handle, run):
        config = ServerConfig.model_validate({
            "blockSize": "1Mi", "masterAddress": f"127.0.0.1:{handle.port}", "heartbeatInterval": 0.2,
            "localSources": {"allowedRoots": [str(tmp_path)]},
            "tiers": [{"medium": "SSD", "quota": "64Mi", "dirs": [str(tmp_path / "w1" / "ssd")]}],
        })
        worker = run(start_worker(config, data_dir=tmp_path / "w1", credentials=Credentials.from_admin(MASTER_TOKEN),
                                  bind="127.0.0.1", port=0, http_port=0, data_port=0,
                                  identity=WorkerIdentity(worker_id="w1", host="h", advertise="127.0.0.1")))
        fs = StrataFileSystem(master=f"127.0.0.1:{handle.port}", token=MASTER_TOKEN, host="h", skip_instance_cache=True)
        try:
            fs.client.mount("/m", f"file://{store}", pb.MountOptions(metadata_sync_interval=0))
            deadline = time.monotonic() + 20
            while not fs.client.workers(refresh=True):
                assert time.monotonic() < deadline, "the worker did not register with the master within 20s"
                time.sleep(0.1)
            yield fs, store
        finally:
            fs.client.close()
            run(worker.stop(grace=0))


def test_each_open_mode_writes_and_reads_as_a_python_file_does(mounted: tuple[StrataFileSystem, Path]) -> None:
    fs, store = mounted
    with fs.open("/m/f", "wb") as f:
        f.write(b"hello")
    assert (store / "f").read_bytes() == b"hello"
    with fs.open("strata:///m/f", "rb") as f:
        assert f.read() == b"hello"
    with fs.open("/m/f", "ab") as f:
        assert f.tell() == 5  # counts from the end of what is there
        f.write(b", world")
    assert fs.cat_file("/m/f") == b"hello, world"
    with pytest.raises(FileExistsError, match="/m/f already exists"):
        fs.open("/m/f", "xb")
    assert fs.cat_file("/m/f") == b"hello, world"  # untouched
    with fs.open("/m/new", "xb") as f:
        f.write(b"x")
    with fs.open("/m/f", "wb") as f:
        f.write(b"replaced")
    assert (fs.cat_file("/m/new"), fs.cat_file("/m/f")) == (b"x", b"replaced")
    with pytest.raises(ValueError, match="rb, wb, xb or ab, not 'r\\+b'"):
        fs.open("/m/f", "r+b")


def test_reads_of_ranges_across_blocks_return_exactly_those_bytes(mounted: tuple[StrataFileSystem, Path]) -> None:
    fs, store = mounted
    data = bytes(range(256)) * (5 * MiB // 2 // 256) + b"last line\nno newline"  # three 1 MiB blocks
    (store / "big").write_bytes(data)
    assert fs.cat_file("/m/big") == data
    assert fs.cat_file("/m/big", start=MiB - 3, end=2 * MiB + 5) == data[MiB - 3:2 * MiB + 5]
    assert fs.cat_file("/m/big", start=-20) == data[-20:]
    assert fs.cat_file("/m/big", start=10, end=-10) == data[10:-10]
    with fs.open("/m/big", "rb") as f:
        assert f.size == len(data)
        f.seek(2 * MiB - 1)
        assert f.read(2) == data[2 * MiB - 1:2 * MiB + 1]
        f.seek(len(data) - len(b"last line\nno newline"))
        assert f.readline() == b"last line\n"
        assert f.readline() == b"no newline"
        assert f.read() == b""


def test_ls_info_and_find_answer_as_fsspec_callers_expect(mounted: tuple[StrataFileSystem, Path]) -> None:
    fs, store = mounted
    (store / "a" / "y").mkdir(parents=True)
    (store / "a" / "x").write_bytes(b"12345")
    (store / "a" / "y" / "z").write_bytes(b"")
    assert sorted(fs.ls("/m/a", detail=False)) == ["/m/a/x", "/m/a/y"]
    by_name = {e["name"]: e for e in fs.ls("strata:///m/a/")}
    assert (by_name["/m/a/x"]["type"], by_name["/m/a/x"]["size"]) == ("file", 5)
    assert by_name["/m/a/y"]["type"] == "directory"
    assert fs.ls("/m/a/x", detail=False) == ["/m/a/x"]  # a file lists as itself
    info = fs.info("/m/a/x")
    assert (info["name"], info["type"], info["size"]) == ("/m/a/x", "file", 5)
    assert fs.info("/m/a")["type"] == "directory"
    assert fs.isdir("/m/a/y") and fs.isfile("/m/a/y/z") and not fs.exists("/m/a/nothing")
    assert fs.find("/m/a") == ["/m/a/x", "/m/a/y/z"]
    assert fs.find("/m/a", withdirs=True) == ["/m/a/x", "/m/a/y", "/m/a/y/z"]
    assert set(fs.find("/m/a", detail=True)) == {"/m/a/x", "/m/a/y/z"}
    assert fs.find("/m/a/x") == ["/m/a/x"]
    assert fs.find("/m/nothing") == []  # as every fsspec filesystem: nothing found
    assert fs.ukey("/m/a/x") == info["version"]
    assert fs.modified("/m/a/x").tzinfo is not None


def test_changes_through_the_filesystem_drop_the_listings_they_touch(mounted: tuple[StrataFileSystem, Path]) -> None:
    fs, store = mounted
    (store / "d").mkdir()
    (store / "d" / "old").write_bytes(b"1")
    assert fs.ls("/m/d", detail=False) == ["/m/d/old"]
    fs.pipe_file("/m/d/new", b"2")
    assert sorted(fs.ls("/m/d", detail=False)) == ["/m/d/new", "/m/d/old"]
    fs.mv("/m/d/old", "/m/d/moved")
    assert sorted(fs.ls("/m/d", detail=False)) == ["/m/d/moved", "/m/d/new"]
    fs.rm("/m/d/new")
    assert fs.ls("/m/d", detail=False) == ["/m/d/moved"]
    assert fs.info("/m/d/moved")["size"] == 1
    fs.cp_file("/m/d/moved", "/m/d/copy")
    assert fs.cat_file("/m/d/copy") == b"1"
    assert sorted(fs.ls("/m/d", detail=False)) == ["/m/d/copy", "/m/d/moved"]
    # A change made beside this object shows once its listing is refreshed (or expires).
    (store / "d" / "beside").write_bytes(b"3")
    assert "/m/d/beside" not in fs.ls("/m/d", detail=False)
    assert "/m/d/beside" in fs.ls("/m/d", detail=False, refresh=True)


def test_server_errors_are_the_python_exceptions_callers_catch(mounted: tuple[StrataFileSystem, Path]) -> None:
    fs, store = mounted
    (store / "dir").mkdir()
    (store / "dir" / "f").write_bytes(b"f")
    with pytest.raises(FileNotFoundError, match="/m/missing"):
        fs.info("/m/missing")
    with pytest.raises(FileNotFoundError, match="/m/missing"):
        fs.open("/m/missing", "rb")
    with pytest.raises(FileNotFoundError):
        fs.rm("/m/missing")
    with pytest.raises(IsADirectoryError, match="/m/dir is a directory"):
        fs.open("/m/dir", "rb")
    with pytest.raises(IsADirectoryError, match="/m/dir is a directory"):
        fs.open("/m/dir", "ab")
    with pytest.raises(FileNotFoundError):
        fs.info("/nowhere/f")  # under no mount
    with pytest.raises(ValueError, match="readahead must be a number of blocks >= 0, got -1"):
        StrataFileSystem(master=fs.client.master_address, token=MASTER_TOKEN, readahead=-1, skip_instance_cache=True)
    assert fs.cat_file("/m/dir/f") == b"f"  # the cluster goes on serving
