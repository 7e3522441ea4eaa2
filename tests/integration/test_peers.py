"""Strata as the tools nobody on the project wrote use it: fsspec's own abstract test suite,
and DuckDB, pandas, pyarrow datasets, Dask and Polars, each reading data whose bytes and
results must equal reading the store directly. A real master and workers over moto's S3."""

from __future__ import annotations

import importlib.util
import os
import posixpath
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import duckdb
import fsspec
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pytest
import s3fs
from fsspec.tests.abstract import AbstractCopyTests, AbstractFixtures, AbstractGetTests, AbstractOpenTests
from fsspec.tests.abstract import AbstractPipeTests, AbstractPutTests

from strata.cacheserver.client.fs import StrataFileSystem

from .conftest import BLOCK_SIZE, TOKEN, Cluster, launch_cluster, remove_shm_tiers, wait_until
from .test_fuse import fuse_skip_reason, start_fuse, stop_fuse

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


# -- fsspec behaviours the suite does not check ------------------------------------------------


def test_append_modified_and_copies_of_files_only_the_cache_holds(peers_cluster: Cluster) -> None:
    fs = peers_cluster.fs()
    base = f"{MOUNT}/behaviours-{uuid.uuid4().hex[:8]}"
    with fs.open(f"{base}/log.txt", "ab") as f:  # appending to nothing makes the file
        f.write(b"one\n")
    with fs.open(f"{base}/log.txt", "ab") as f:
        assert f.tell() == 4
        f.write(b"two\n")
    assert fs.cat_file(f"{base}/log.txt") == b"one\ntwo\n"
    assert peers_cluster.s3.get_object("peers", f"{base.removeprefix(MOUNT + '/')}/log.txt") == b"one\ntwo\n"

    modified = fs.modified(f"{base}/log.txt")
    assert modified.tzinfo is not None
    assert abs(modified.timestamp() - time.time()) < 120

    # Both in the store (write type CACHE_THROUGH): the store copies, no byte leaves it.
    big = os.urandom(BLOCK_SIZE + 5)
    fs.pipe_file(f"{base}/big.bin", big)
    with peers_cluster.s3.recording() as rec:
        fs.cp_file(f"{base}/big.bin", f"{base}/big-copy.bin")
    key = f"{base.removeprefix(MOUNT + '/')}/big"
    assert not rec.matching("GET", f"{key}.bin")
    assert [r for r in rec.matching("PUT", f"{key}-copy.bin")
            if any(h.lower() == "x-amz-copy-source" for h in r.headers)]
    assert fs.cat_file(f"{base}/big-copy.bin") == big

    # A MUST_CACHE file is only in the workers' cache: the copy is made from there.
    cached = peers_cluster.fs(write_type="MUST_CACHE")
    data = os.urandom(BLOCK_SIZE + 17)
    cached.pipe_file(f"{base}/cached.bin", data)
    assert not cached.info(f"{base}/cached.bin")["persisted"]
    cached.cp_file(f"{base}/cached.bin", f"{base}/copy.bin")
    assert fs.cat_file(f"{base}/copy.bin") == data
    with pytest.raises(FileExistsError):
        fs.open(f"{base}/copy.bin", "xb")
    assert fs.find(f"{base}/missing") == []


# -- real clients: their results must equal reading the store directly ---------------------------

DATASET = "clients/sales"


@pytest.fixture(scope="module")
def sales(peers_cluster: Cluster) -> pa.Table:
    """A hive-partitioned Parquet dataset put into the store directly (not through Strata);
    the table as the store holds it, read back through s3fs."""
    rows = 6000
    table = pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "amount": pa.array([(i * 7919) % 1000 / 10 for i in range(rows)], pa.float64()),
        "region": pa.array([["eu", "us", "ap"][i % 3] for i in range(rows)]),
        "year": pa.array([2023 + i % 2 for i in range(rows)], pa.int32()),
    })
    store = s3fs.S3FileSystem(**s3_options(peers_cluster), skip_instance_cache=True)
    pds.write_dataset(table, f"peers/{DATASET}", format="parquet", partitioning=["region", "year"],
                      partitioning_flavor="hive", filesystem=store, max_rows_per_group=1000)
    read = pds.dataset(f"peers/{DATASET}", format="parquet", partitioning="hive", filesystem=store).to_table()
    assert read.num_rows == rows and len(store.find(f"peers/{DATASET}")) == 6
    return sorted_by_id(read)


def s3_options(cluster: Cluster) -> dict[str, Any]:
    o = cluster.s3.storage_options()
    return {"key": o["key"], "secret": o["secret"], "client_kwargs": {"endpoint_url": o["endpoint_url"]}}


def strata_options(cluster: Cluster) -> dict[str, Any]:
    return {"master": cluster.master_address, "token": TOKEN, "host": "peer-client"}


def sorted_by_id(table: pa.Table) -> pa.Table:
    table = table.select(["id", "amount", "region", "year"])
    table = table.cast(pa.schema([("id", pa.int64()), ("amount", pa.float64()), ("region", pa.string()), ("year", pa.int32())]))
    return table.sort_by("id")


def test_duckdb_reads_parquet_through_the_registered_filesystem(peers_cluster: Cluster, sales: pa.Table) -> None:
    con = duckdb.connect()
    try:
        con.register_filesystem(fsspec.filesystem("strata", skip_instance_cache=True, **strata_options(peers_cluster)))
        got = con.sql(f"SELECT id, amount, region, CAST(year AS INTEGER) AS year FROM read_parquet("
                      f"'strata://{MOUNT}/{DATASET}/**/*.parquet', hive_partitioning = true)").to_arrow_table()
        by_region = con.sql(f"SELECT region, count(*), sum(amount) FROM read_parquet("
                            f"'strata://{MOUNT}/{DATASET}/**/*.parquet', hive_partitioning = true) "
                            "GROUP BY region ORDER BY region").fetchall()
    finally:
        con.close()
    assert sorted_by_id(got).equals(sales)
    expected = sales.group_by("region").aggregate([("id", "count"), ("amount", "sum")]).sort_by("region")
    assert [r[0] for r in by_region] == expected["region"].to_pylist()
    assert [r[1] for r in by_region] == expected["id_count"].to_pylist()
    assert [r[2] for r in by_region] == pytest.approx(expected["amount_sum"].to_pylist())


def test_pandas_and_pyarrow_datasets_read_the_stores_rows(peers_cluster: Cluster, sales: pa.Table) -> None:
    frame = pd.read_parquet(f"strata://{MOUNT}/{DATASET}", storage_options=strata_options(peers_cluster))
    direct = pd.read_parquet(f"s3://peers/{DATASET}", storage_options=s3_options(peers_cluster))
    pd.testing.assert_frame_equal(frame.sort_values("id").reset_index(drop=True),
                                  direct.sort_values("id").reset_index(drop=True))

    fs = peers_cluster.fs()
    dataset = pds.dataset(f"{MOUNT}/{DATASET}", format="parquet", partitioning="hive", filesystem=fs)
    assert sorted_by_id(dataset.to_table()).equals(sales)
    eu_2024 = dataset.to_table(filter=(pds.field("region") == "eu") & (pds.field("year") == 2024))
    assert sorted_by_id(eu_2024).equals(sales.filter(pc.and_(pc.equal(sales["region"], "eu"), pc.equal(sales["year"], 2024))))
    assert len(dataset.files) == 6


def test_dask_with_processes_pickles_the_filesystem_and_gets_the_stores_sums(peers_cluster: Cluster, sales: pa.Table) -> None:
    frame = dd.read_parquet(f"strata://{MOUNT}/{DATASET}", storage_options=strata_options(peers_cluster))
    with dask.config.set(scheduler="processes", num_workers=2):
        sums = frame.groupby("region")["amount"].sum().compute()
        rows = len(frame)
    assert rows == sales.num_rows
    expected = sales.group_by("region").aggregate([("amount", "sum")])
    assert dict(sums.items()) == pytest.approx(dict(zip(expected["region"].to_pylist(), expected["amount_sum"].to_pylist())))


@pytest.mark.fuse
@pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason()))
def test_polars_reads_the_fuse_mounts_files(peers_cluster: Cluster, sales: pa.Table, tmp_path: Path) -> None:
    fuse = start_fuse(peers_cluster, tmp_path / "mnt")
    try:
        root = tmp_path / "mnt" / MOUNT.lstrip("/") / DATASET
        frame = pl.read_parquet(root / "**" / "*.parquet", hive_partitioning=True)
        got = frame.select(["id", "amount", "region", pl.col("year").cast(pl.Int32)]).to_arrow()
        assert sorted_by_id(got).equals(sales)
        lazy = pl.scan_parquet(root / "**" / "*.parquet", hive_partitioning=True)
        total = lazy.filter(pl.col("region") == "us").select(pl.col("amount").sum()).collect().item()
        assert total == pytest.approx(pc.sum(sales.filter(pc.equal(sales["region"], "us"))["amount"]).as_py())
    finally:
        stop_fuse(fuse)


# -- cachePolicy.readaheadBlocks reaches the readers ---------------------------------------------


@pytest.mark.parametrize("policy", [0, 3])
def test_the_clusters_readahead_policy_sets_how_far_a_sequential_reader_fetches_ahead(
        start_cluster: Any, bucket: str, policy: int) -> None:
    cluster = start_cluster(workers=1, extra={"cachePolicy": {"readaheadBlocks": policy}})
    blocks = 6
    data = os.urandom(blocks * BLOCK_SIZE)
    cluster.s3.put_object(bucket, "seq/part-0", data)
    cluster.mount_bucket("/ra", bucket)
    fs = cluster.fs()
    path = "/ra/seq/part-0"
    assert fs.info(path)["readahead_blocks"] == policy

    expected = (1 + policy) * BLOCK_SIZE  # block 0 and the `policy` blocks after it
    with cluster.s3.recording() as rec:
        with fs.open(path, "rb") as f:
            assert f.read(BLOCK_SIZE) == data[:BLOCK_SIZE]  # the first block, read sequentially
            wait_until(lambda: fs.info(path)["cached_bytes"] >= expected, 30, f"{1 + policy} blocks in the cache")
        time.sleep(1.0)  # a bounded wait: would any more come?
    assert fs.info(path)["cached_bytes"] == expected
    assert len(rec.matching("GET", "/seq/part-0")) == 1 + policy


@pytest.mark.fuse
@pytest.mark.skipif(fuse_skip_reason() is not None, reason=str(fuse_skip_reason()))
@pytest.mark.skipif(os.environ.get("STRATA_TEST_SPARK") != "1" or importlib.util.find_spec("pyspark") is None,
                    reason="opt-in: set STRATA_TEST_SPARK=1 with pyspark installed (and Java)")
def test_spark_reads_the_fuse_mounts_parquet(peers_cluster: Cluster, sales: pa.Table, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession, functions

    fuse = start_fuse(peers_cluster, tmp_path / "mnt")
    spark: Any = None
    try:
        spark = (SparkSession.builder.master("local[2]").appName("strata-peers")
                 .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        frame = spark.read.parquet(str(tmp_path / "mnt" / MOUNT.lstrip("/") / DATASET))
        assert frame.count() == sales.num_rows
        sums = {r["region"]: r["total"] for r in frame.groupBy("region").agg(functions.sum("amount").alias("total")).collect()}
        expected = sales.group_by("region").aggregate([("amount", "sum")])
        assert sums == pytest.approx(dict(zip(expected["region"].to_pylist(), expected["amount_sum"].to_pylist())))
        assert sorted(r["year"] for r in frame.select("year").distinct().collect()) == [2023, 2024]
    finally:
        if spark is not None:
            spark.stop()
        stop_fuse(fuse)
