"""The block store's file work, done in threads off the event loop: writing, copying, syncing
and removing a block's files and rewriting sidecars, and the helper that runs such work to
its end even when its caller is cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from ..common.durable import fsync_dir
from .files import block_file, copy_atomically, fsync_file, meta_file, remove_block_files, write_atomically
from .metadata import BlockMetadata

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


async def finish_in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking file work in a thread. If the caller is cancelled, wait for the thread
    anyway (it cannot be stopped) so the caller's clean-up sees the files as they end up."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def write_block(directory: Path, meta: BlockMetadata, data: bytes, durable: bool) -> None:
    write_atomically(block_file(directory, meta.key.block_id), data, durable=durable)
    meta.write(meta_file(directory, meta.key.block_id), durable=durable)
    if durable:
        fsync_dir(directory)


def copy_block(src_dir: Path, dst_dir: Path, meta: BlockMetadata, durable: bool) -> None:
    block_id = meta.key.block_id
    copy_atomically(block_file(src_dir, block_id), block_file(dst_dir, block_id), durable=durable)
    meta.write(meta_file(dst_dir, block_id), durable=durable)
    if durable:
        fsync_dir(dst_dir)


def sync_block(directory: Path, block_id: str) -> None:
    """Put a block's files, written without fsync, on the disk."""
    fsync_file(block_file(directory, block_id))
    fsync_file(meta_file(directory, block_id))
    fsync_dir(directory)


def remove_all(blocks: list[tuple[Path, str]]) -> None:
    for directory, block_id in blocks:
        remove_block_files(directory, block_id)


def write_sidecars(sidecars: list[tuple[BlockMetadata, Path]]) -> None:
    for meta, path in sidecars:
        try:
            meta.write(path)
        except OSError as exc:
            log.warning("cannot write sidecar %s: %s", path, exc)
