"""Strata as the tools nobody on the project wrote use it: fsspec's own abstract test suite,
and DuckDB, pandas, pyarrow datasets, Dask and Polars, each reading data whose bytes and
results must equal reading the store directly. A real master and workers over moto's S3."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.tests.abstract import AbstractCopyTests, AbstractFixtures, AbstractGetTests, AbstractOpenTests
from fsspec.tests.abstract import AbstractPipeTests, AbstractPutTests

from strata.cacheserver.client.fs import StrataFileSystem

from .conftest import Cluster, launch_cluster, remove_shm_tiers

MOUNT = "/peers"


@pytest.fixture(scope="module")
def peers_cluster(tmp_path_factory: pytest.TempPathFactory, s3: Any) -> Iterator[Cluster]:
    """One cluster for the module (the abstract suite has ~140 tests), a writable S3 mount."""
    clusters: list[Cluster] = []
    try:
        cluster = launch_cluster(tmp_path_factory.mktemp("peers") / "cluster", s3, workers=2, clusters=clusters)
        s3.create_bucket("peers")
        cluster.mount_bucket(MOUNT, "peers", metadata_sync_interval=0)
        yield cluster
    finally:
        for cluster in clusters:
            cluster.stop()
        remove_shm_tiers()


class StrataFixtures(AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, peers_cluster: Cluster) -> StrataFileSystem:
        return peers_cluster.fs()

    @pytest.fixture
    def fs_join(self) -> Any:
        return posixpath.join

    @pytest.fixture
    def fs_path(self) -> str:
        return f"{MOUNT}/abstract-{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # an object store: a folder exists while something is below it


class TestStrataCopy(AbstractCopyTests, StrataFixtures):  # type: ignore[misc]
    pass


class TestStrataGet(AbstractGetTests, StrataFixtures):  # type: ignore[misc]
    pass


class TestStrataPut(AbstractPutTests, StrataFixtures):  # type: ignore[misc]
    pass


class TestStrataOpen(AbstractOpenTests, StrataFixtures):  # type: ignore[misc]
    pass


class TestStrataPipe(AbstractPipeTests, StrataFixtures):  # type: ignore[misc]
    pass
