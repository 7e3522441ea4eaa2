"""Finding mount points and telling live ones from absent ones (stale FUSE mounts are tested
with real FUSE processes in tests/integration/test_fuse.py)."""

from __future__ import annotations

from pathlib import Path

from strata.cacheserver.fuse.mountpoints import MountState, find_mount, mount_state, parse_mountinfo, wait_unmounted

MOUNTINFO = """\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
43 22 0:39 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:5 - fuse.strata strata:/data rw,user_id=0,group_id=0
44 22 0:40 / /ro ro,relatime - tmpfs tmpfs ro,size=1024k
"""


def test_mountinfo_lines_give_mount_point_type_source_options_and_device() -> None:
    entries = parse_mountinfo(MOUNTINFO)
    assert [e.mount_point for e in entries] == ["/", "/tmp/my mnt", "/ro"]
    fuse = entries[1]
    assert (fuse.fstype, fuse.source, fuse.read_only, fuse.device) == ("fuse.strata", "strata:/data", False, "0:39")
    assert entries[2].read_only


def test_a_plain_directory_is_not_a_mount(tmp_path: Path) -> None:
    assert find_mount(tmp_path) is None
    assert mount_state(tmp_path) is MountState.ABSENT
    assert mount_state(tmp_path / "missing") is MountState.ABSENT
    assert wait_unmounted(tmp_path, 0.1)


def test_the_root_and_proc_are_live_mounts() -> None:
    assert mount_state("/") is MountState.LIVE
    proc = find_mount("/proc")
    assert proc is not None and proc.fstype == "proc"
