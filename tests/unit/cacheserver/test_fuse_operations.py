"""Pieces of the FUSE callbacks that need no kernel: metadata timeouts and error numbers.
The callbacks themselves run against real mounts in tests/integration/test_fuse.py."""

from __future__ import annotations

import errno

import pytest

from strata.cacheserver.fuse.operations import DEFAULT_ATTR_TIMEOUT, MAX_ATTR_TIMEOUT, attr_timeout_for, errno_of
from strata.contract import errors
from strata.contract.proto import strata_pb2 as pb


def mount(path: str, interval: float) -> pb.MountInfo:
    return pb.MountInfo(path=path, options=pb.MountOptions(metadata_sync_interval=interval))


MOUNTS = [mount("/datasets/a", 30), mount("/datasets/b", 0), mount("/logs", -1), mount("/fast", 5)]


@pytest.mark.parametrize(("root", "expected"), [
    ("/datasets/a", 30),            # inside one mount: its interval
    ("/datasets/a/train", 30),
    ("/datasets", 0),               # shows two mounts: the stricter one wins
    ("/logs", MAX_ATTR_TIMEOUT),    # never synced: still capped
    ("/", 0),
    ("/fast", 5),
    ("/elsewhere", DEFAULT_ATTR_TIMEOUT),
])
def test_metadata_timeout_follows_the_mounts_sync_intervals(root: str, expected: float) -> None:
    assert attr_timeout_for(MOUNTS, root) == expected


def test_long_intervals_are_capped() -> None:
    assert attr_timeout_for([mount("/x", 3600)], "/x") == MAX_ATTR_TIMEOUT


@pytest.mark.parametrize(("error", "code"), [
    (errors.NotFound("x"), errno.ENOENT),
    (errors.AlreadyExists("x"), errno.EEXIST),
    (errors.PermissionDenied("x"), errno.EACCES),
    (errors.Unauthenticated("x"), errno.EACCES),
    (errors.InvalidArgument("x"), errno.EINVAL),
    (errors.ResourceExhausted("x"), errno.ENOSPC),
    (errors.Unavailable("x"), errno.EIO),
    (errors.DataLoss("x"), errno.EIO),
    (errors.StrataError("x"), errno.EIO),
])
def test_client_errors_become_errno(error: errors.StrataError, code: int) -> None:
    assert errno_of(error) == code
