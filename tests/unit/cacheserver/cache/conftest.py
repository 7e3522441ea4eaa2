"""Fixtures for the block store tests: real tier directories (MEM under /dev/shm, SSD and
HDD under pytest's tmp_path), every registered eviction policy, a change recorder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.cacheserver.cache import EVICTION_POLICIES, BlockStore, CachedBlock, TierConfig
from strata.cacheserver.common.keys import BlockKey
from strata.contract.constants import MEDIA


class Recorder:
    """Collects on_change calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[CachedBlock], list[BlockKey]]] = []

    def __call__(self, added: list[CachedBlock], removed: list[BlockKey]) -> None:
        self.calls.append((added, removed))

    @property
    def added(self) -> list[BlockKey]:
        return [b.key for added, _ in self.calls for b in added]

    @property
    def removed(self) -> list[BlockKey]:
        return [k for _, removed in self.calls for k in removed]

    def clear(self) -> None:
        self.calls.clear()


class Dirs:
    """One directory per medium: MEM in /dev/shm (so fd passing is real), others on disk."""

    def __init__(self, shm: Path, disk: Path) -> None:
        self.shm, self.disk = shm, disk

    def __call__(self, medium: str) -> Path:
        return (self.shm if medium == "MEM" else self.disk) / medium.lower()

    def files(self, medium: str, suffix: str = ".blk") -> list[Path]:
        d = self(medium)
        return sorted(d.glob(f"*{suffix}")) if d.exists() else []


MakeStore = Callable[..., Awaitable[BlockStore]]


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="strata-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dirs(shm_dir: Path, tmp_path: Path) -> Dirs:
    return Dirs(shm_dir, tmp_path)


@pytest.fixture(params=sorted(EVICTION_POLICIES))
def eviction(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(params=MEDIA)
def medium(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def make_store(dirs: Dirs, eviction: str, recorder: Recorder) -> AsyncIterator[MakeStore]:
    """make_store(("MEM", quota), ("SSD", quota), ..., **BlockStore options): an open store
    over the test's directories, closed at the end of the test."""
    stores: list[BlockStore] = []

    async def make(*tiers: tuple[str, int], **options: Any) -> BlockStore:
        options.setdefault("eviction", eviction)
        options.setdefault("on_change", recorder)
        configs = [TierConfig(m, quota, (dirs(m),)) for m, quota in tiers]
        store = BlockStore(configs, **options)
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()
