from __future__ import annotations

import errno
import json
import stat
from pathlib import Path

import pytest
from tinydisk import filled, tiny_disk

from strata.cacheserver.namespace.mounts import Mount, MountOptions, MountTable
from strata.cacheserver.namespace.tree import Namespace
from strata.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound


def test_add_get_list_and_resolve() -> None:
    table = MountTable(None)
    a = table.add("/datasets/a", "memory://a")
    b = table.add("/logs/", "file:///var/log", MountOptions(read_only=True))
    assert a.mount_id != b.mount_id
    assert b.path == "/logs" and b.options.read_only
    assert table.get("/logs") == b and table.get("/nothing") is None
    assert [m.path for m in table.list()] == ["/datasets/a", "/logs"]
    assert table.resolve("/datasets/a/x/y.parquet") == (a, "x/y.parquet")
    assert table.resolve("/datasets/a") == (a, "")
    assert table.by_id(b.mount_id) == b


def test_resolve_outside_any_mount_names_the_mounts() -> None:
    table = MountTable(None)
    with pytest.raises(NotFound, match="no mount covers /x; there are no mounts yet"):
        table.resolve("/x")
    table.add("/b", "memory://b")
    table.add("/a", "memory://a")
    with pytest.raises(NotFound, match="no mount covers /x/y; mounts: /a, /b"):
        table.resolve("/x/y")
    with pytest.raises(NotFound, match="no mount covers /ab"):
        table.resolve("/ab")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/", "cannot mount at /"),
        ("//", "cannot mount at /"),
        ("data", "mount path must be absolute, got 'data'"),
        ("/a/../..", "climbs above /"),
    ],
)
def test_bad_mount_paths_are_refused(path: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        MountTable(None).add(path, "memory://x")


def test_mount_points_cannot_nest_either_way() -> None:
    table = MountTable(None)
    table.add("/data/a", "memory://a")
    with pytest.raises(InvalidArgument, match="mount path /data/a/inner overlaps the existing mount /data/a"):
        table.add("/data/a/inner", "memory://b")
    with pytest.raises(InvalidArgument, match="mount path /data overlaps the existing mount /data/a"):
        table.add("/data", "memory://c")
    table.add("/data/ab", "memory://d")  # a sibling with a common prefix is fine


def test_same_path_needs_replace_and_gets_a_new_id() -> None:
    table = MountTable(None)
    first = table.add("/a", "memory://one")
    with pytest.raises(AlreadyExists, match="/a is already mounted \\(from memory://one\\)"):
        table.add("/a", "memory://two")
    version = table.version
    second = table.add("/a", "memory://two", replace=True)
    assert second.mount_id > first.mount_id and second.source == "memory://two"
    assert table.version == version + 1
    assert table.list() == [second]


def test_a_new_journal_never_gives_an_id_an_earlier_journal_gave(tmp_path: Path) -> None:
    """A master whose journal is lost (its pod replaced on an emptyDir, a disk lost) starts
    with an empty table, while workers keep blocks keyed by the old mount ids: the same path
    and source mounted again must get an id no earlier mount had, or old blocks would match."""
    old = MountTable(tmp_path / "old")
    given = {old.add(f"/m{i}", f"memory://m{i}").mount_id for i in range(5)}
    given.add(old.add("/m0", "memory://other", replace=True).mount_id)
    lost = MountTable(tmp_path / "new")  # the journal is gone: a new, empty one
    again = [lost.add(f"/m{i}", f"memory://m{i}").mount_id for i in range(5)]
    assert min(again) > max(given)
    assert MountTable(None).add("/m0", "memory://m0").mount_id > max(again)  # no journal at all
    assert MountTable(tmp_path / "new").add("/n", "memory://n").mount_id > max(again)  # a kept one goes on


def test_unknown_scheme_and_bad_options_are_refused() -> None:
    table = MountTable(None)
    with pytest.raises(InvalidArgument, match="unknown store scheme 'nope'"):
        table.add("/a", "nope://x")
    with pytest.raises(InvalidArgument, match="store option 'colour' is not an S3 option"):
        table.add("/a", "s3://bucket/x", MountOptions(options={"colour": "blue"}))
    assert table.list() == [] and table.version == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metadata_sync_interval": -2}, "metadata sync interval must be 0 \\(every access\\), -1 \\(never\\)"),
        ({"ttl_seconds": -1}, "ttl must not be negative"),
        ({"read_type": "SOMETIMES"}, "read type must be one of CACHE, CACHE_PROMOTE, NO_CACHE"),
        ({"write_type": "LATER"}, "write type must be one of MUST_CACHE"),
    ],
)
def test_bad_mount_options_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        MountOptions(**fields)  # type: ignore[arg-type]


def test_remove_unknown_mount_lists_existing_ones() -> None:
    table = MountTable(None)
    mount = table.add("/a", "memory://a")
    with pytest.raises(NotFound, match="nothing is mounted at /b; mounts: /a"):
        table.remove("/b")
    assert table.remove("/a/") == mount
    assert table.list() == []


def test_version_bumps_on_every_change() -> None:
    table = MountTable(None)
    versions = [table.version]
    table.add("/a", "memory://a")
    versions.append(table.version)
    table.add("/a", "memory://b", replace=True)
    versions.append(table.version)
    table.remove("/a")
    versions.append(table.version)
    assert versions == sorted(set(versions))


def test_table_survives_a_restart_in_a_private_file(tmp_path: Path) -> None:
    options = MountOptions(
        options={"endpoint_url": "http://127.0.0.1:1"},
        credentials={"key": "AKIAEXAMPLE", "secret": "s3cr3t"},
        read_only=True,
        metadata_sync_interval=-1,
        write_type="THROUGH",
        pin=True,
        ttl_seconds=3600,
    )
    table = MountTable(tmp_path)
    a = table.add("/a", "s3://bucket/a", options)
    b = table.add("/b", "memory://b")
    table.remove("/b")
    state = tmp_path / "mounts.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))

    again = MountTable(tmp_path)
    assert again.list() == [a]
    assert again.version == table.version
    assert again.list()[0].options.credentials == {"key": "AKIAEXAMPLE", "secret": "s3cr3t"}
    c = again.add("/c", "memory://c")
    assert c.mount_id > b.mount_id  # ids are never reused, even across restarts


def test_corrupt_state_is_reported(tmp_path: Path) -> None:
    (tmp_path / "mounts.json").write_text("{not json")
    with pytest.raises(Exception, match="mounts.json is not valid JSON"):
        MountTable(tmp_path)


def test_credentials_stay_out_of_repr() -> None:
    mount = MountTable(None).add("/a", "s3://bucket/a", MountOptions(credentials={"secret": "hunter2"}))
    assert "hunter2" not in repr(mount) and "hunter2" not in repr(mount.options)


async def test_one_store_per_mount_replaced_on_remount() -> None:
    table = MountTable(None)
    first = table.add("/a", "memory://one")
    store = table.store(first)
    assert table.store(first) is store and store.source == "memory://one"
    second = table.add("/a", "memory://two", replace=True)
    assert table.store(second) is not store and table.store(second).source == "memory://two"
    with pytest.raises(NotFound, match=f"mount /a \\(id {first.mount_id}\\) was unmounted or replaced"):
        table.store(first)
    await table.aclose()


def test_a_reloaded_table_makes_stores_lazily(tmp_path: Path) -> None:
    MountTable(tmp_path).add("/a", "memory://lazy")
    again = MountTable(tmp_path)
    mount = again.list()[0]
    assert isinstance(mount, Mount)
    assert again.store(mount).source == "memory://lazy"


def test_state_file_holds_what_a_restart_needs(tmp_path: Path) -> None:
    MountTable(tmp_path).add("/a", "memory://a", MountOptions(metadata_sync_interval=5))
    data = json.loads((tmp_path / "mounts.json").read_text())
    assert data["next_id"] == data["mounts"][0]["mount_id"] + 1 and data["version"] == 1
    assert data["mounts"][0]["options"]["metadata_sync_interval"] == 5


def test_a_table_saved_in_the_clear_is_sealed_at_the_next_save(tmp_path: Path) -> None:
    credentials = {"key": "AKIAEXAMPLE", "secret": "s3cr3t"}
    MountTable(tmp_path).add("/a", "s3://bucket/a", MountOptions(credentials=credentials))
    assert "s3cr3t" in (tmp_path / "mounts.json").read_text()  # no cluster key: as given
    table = MountTable(tmp_path, cluster_key="cluster-internal-token")
    assert table.get("/a") is not None and dict(table.get("/a").options.credentials) == credentials  # type: ignore[union-attr]
    table.add("/b", "memory://b")
    text = (tmp_path / "mounts.json").read_text()
    assert "s3cr3t" not in text and "AKIAEXAMPLE" not in text and "sealed_credentials" in text
    again = MountTable(tmp_path, cluster_key="cluster-internal-token")
    assert dict(again.get("/a").options.credentials) == credentials  # type: ignore[union-attr]


async def test_a_mount_whose_credentials_cannot_be_opened_stays_unusable_with_its_writes(tmp_path: Path) -> None:
    # The master runs with another cluster key: the mount is kept (its written files with it),
    # every access names it and why, no store is made for it, and its sealed credentials are
    # saved again untouched, so the right key opens them again.
    credentials = {"key": "AKIAEXAMPLE", "secret": "s3cr3t"}
    table = MountTable(tmp_path, cluster_key="old-key")
    a = table.add("/a", "memory://a", MountOptions(credentials=credentials))
    Namespace(table, tmp_path, block_size=4096).commit_file("/a/only-cached", length=3, version="w-1",
                                                            persisted=False)
    sealed = json.loads((tmp_path / "mounts.json").read_text())["mounts"][0]["sealed_credentials"]

    other = MountTable(tmp_path, cluster_key="new-key")
    kept = other.get("/a")
    assert kept is not None and kept.mount_id == a.mount_id and not kept.options.credentials
    namespace = Namespace(other, tmp_path, block_size=4096)
    problem = rf"mount /a \(from memory://a\) cannot be used: sealed credentials of /a#{a.mount_id} cannot be opened"
    for access in (lambda: other.resolve("/a/x"), lambda: other.store(kept)):
        with pytest.raises(FailedPrecondition, match=problem):
            access()
    for call in (namespace.get_status("/a/only-cached"), namespace.list_status("/a"), namespace.list_status("/", True)):
        with pytest.raises(FailedPrecondition, match=problem):
            await call
    assert namespace.written("/a/only-cached") is not None
    other.add("/b", "memory://b")  # a save of the table
    assert json.loads((tmp_path / "mounts.json").read_text())["mounts"][0]["sealed_credentials"] == sealed
    assert dict(MountTable(tmp_path, cluster_key="old-key").get("/a").options.credentials) == credentials  # type: ignore[union-attr]

    # Mounted again with its credentials: the same data keeps its id, and its written files.
    again = other.add("/a", "memory://a", MountOptions(credentials=credentials), replace=True)
    assert again.mount_id == a.mount_id and not again.unusable
    assert (await Namespace(MountTable(tmp_path, cluster_key="new-key"), tmp_path,
                            block_size=4096).get_status("/a/only-cached")).version == "w-1"


def test_a_change_the_journal_cannot_hold_is_not_made(tmp_path: Path) -> None:
    # A full journal disk: the Mount or Unmount fails, and the table stays as the journal
    # has it. (A mount kept only in memory was answered "already mounted" to the retry, took
    # writes, and was gone after a restart, with the files written to it.)
    with tiny_disk("1m") as disk:
        table = MountTable(disk, cluster_key="cluster-key")
        a = table.add("/a", "memory://a", MountOptions(credentials={"key": "secret"}))
        with filled(disk):
            with pytest.raises(OSError) as failed:
                table.add("/b", "memory://b")
            assert failed.value.errno == errno.ENOSPC
            with pytest.raises(OSError):
                table.remove("/a")
            with pytest.raises(OSError):
                table.add("/a", "memory://other", replace=True)
            assert table.list() == [a] and table.version == 1
        b = table.add("/b", "memory://b")  # the retry, once there is room
        assert b.mount_id > a.mount_id
        assert MountTable(disk, cluster_key="cluster-key").list() == [a, b]
