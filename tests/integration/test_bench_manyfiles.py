"""The benchmark's many-files workload (bench/manyfiles.py, issue 27) at a tiny size: it runs
against a real master, worker and read-only FUSE mount, checks every walk and stat saw every
file, and judges each of the issue's targets (PASS or MISS, never left unmeasured). Speed is
the benchmark's to judge: this asserts only that every number is measured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import TOKEN, Cluster, allow
from .test_fuse import FuseProcess, mount_fuse  # noqa: F401 - the fixture

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import manyfiles  # noqa: E402
import report  # noqa: E402

pytestmark = pytest.mark.timeout(300)

FILES = 2_500  # three folders of folders' worth: t000/d00..d02 (the last one half full)
STAT_FILES = 400


def test_the_many_files_workload_measures_every_target_of_issue_27(
        start_cluster: Any, tmp_path: Path, mount_fuse: Callable[..., FuseProcess]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cluster: Cluster = start_cluster(workers=1, **allow(data))
    process = cluster.master.process
    assert process is not None
    mounted: dict[str, Path] = {}

    def fuse(mount: str) -> Path:
        if mount not in mounted:
            mounted[mount] = mount_fuse(cluster, "--read-only", "--root", mount, host="node-0").path
        return mounted[mount]

    servers = manyfiles.Servers(cluster.master_address, process.pid, cluster.master.http_port, TOKEN, "node-0",
                                "elsewhere", fuse=fuse, fuse_unavailable=lambda: "")
    w = manyfiles.measure(servers, data, FILES, STAT_FILES, log=lambda _: None)

    assert sorted(p.name for p in (data / "tree" / "t000").iterdir()) == ["d00", "d01", "d02"]
    assert (data / "tree" / "t000" / "d02" / "f499.bin").read_bytes() == b"%08d" % 2499 * 128
    listed = {(s.contestant, s.phase): s for s in w.series}
    for key in (("local", "list"), ("strata-client", "list"), ("strata-fuse", "list"), ("namespace", "list"),
                ("local", "stat"), ("strata-sc", "stat"), ("strata-fuse", "stat")):
        assert key in listed and listed[key].ok and not listed[key].failures, key
    targets = report.judge_issue27([w])
    assert {t.id for t in targets} == {
        "i27-list/strata-client", "i27-list/strata-fuse", "i27-list/namespace", "i27-stat/strata-sc",
        "i27-stat/strata-fuse", "i27-master-cpu/strata-sc", "i27-master-cpu/strata-fuse", "i27-memory/mount",
        "i27-memory/find", "i27-healthz", "i27-latency/mount_add_s", "i27-latency/report_s", "i27-workers",
        "i27-stale"}
    assert all(t.verdict in ("PASS", "MISS") and t.value is not None for t in targets), targets
    assert w.extra["health_probes"] > 0 and w.extra["workers_dropped"] == 0 and w.extra["report_totalled"]
    assert w.extra["strata-sc_master_get_status"] <= STAT_FILES  # the node answered the rest
    markdown = "\n".join(report.targets_table(targets))
    assert "| issue 27: whole listing (find) through FUSE (2,500 files) |" in markdown
