"""A fresh mount's first recursive listing streams while the master walks the store (issue 27,
target 2): the first page comes as soon as the walk has put it in, not after the whole walk,
and the streamed listing is exactly the one the finished walk gives.

Real processes: a master and a worker started as users start them, a file:// store of 60,000
files whose walk takes seconds. The order of events is the proof, not a time: a file put
into the tree's last folder after the first page came is in the listing only if the walk had
not reached that folder when the first page was sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strata.contract.proto import strata_pb2 as pb

from .conftest import Cluster, allow
from .test_large_tree import make_tree

pytestmark = pytest.mark.timeout(600)

FOLDERS = 60
FILES_PER_FOLDER = 1000


def test_a_fresh_mounts_find_streams_while_the_walk_runs_and_equals_the_finished_listing(
        start_cluster: Any, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    files = make_tree(root, FOLDERS, FILES_PER_FOLDER)
    (root / "zzz").mkdir()  # the walk's last folder
    cluster: Cluster = start_cluster(workers=1, **allow(tmp_path))
    fs = cluster.fs()
    fs.client.mount("/tree", f"file://{root}", pb.MountOptions(read_only=True, metadata_sync_interval=3600))
    pages = fs.client.ls_pages("/tree", recursive=True)
    first = next(pages)
    # The walk is at the first folders: a file put into the last one now is found by it.
    (root / "zzz" / "late.bin").write_bytes(b"late")
    streamed = [(f.path, f.is_dir, f.length) for f in first + [f for page in pages for f in page]]
    assert streamed[:2] == [("/tree/d0000", True, 0), ("/tree/d0000/f00000.bin", False, 0)]
    assert ("/tree/zzz/late.bin", False, 4) in streamed, "the first page came only after the walk had ended"
    assert sum(not is_dir for _, is_dir, _ in streamed) == files + 1
    # The finished walk's listing (the master's cache now): the same entries, once each, in order.
    whole = [(f.path, f.is_dir, f.length) for f in fs.client.ls("/tree", recursive=True)]
    assert streamed == whole
    assert len({path for path, _, _ in streamed}) == len(streamed)
    assert [path for path, _, _ in streamed] == sorted(path for path, _, _ in streamed)
