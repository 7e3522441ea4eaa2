"""How the master shows its state in protobuf messages: mounts and their options, and file
entries as clients get them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strata.contract.config import ServerConfig
from strata.contract.modes import ReadType, WriteType
from strata.contract.proto import strata_pb2 as pb
from strata.contract.urls import shown_url
from ..namespace.entries import FileEntry
from ..namespace.tree import Namespace
from ..namespace.mounts import Mount as NsMount
from ..namespace.mounts import MountOptions
from .blocks import BlockIndex


def options_from_proto(options: pb.MountOptions, has_options: bool) -> MountOptions:
    if not has_options:
        return MountOptions()
    return MountOptions(
        options=dict(options.options),
        credentials=dict(options.credentials),
        read_only=options.read_only,
        metadata_sync_interval=options.metadata_sync_interval,
        read_type=ReadType.name_of(options.read_type),
        write_type=WriteType.name_of(options.write_type),
        pin=options.pin,
        ttl_seconds=options.ttl_seconds,
        stale_if_error=options.stale_if_error if options.HasField("stale_if_error") else True,
    )


def mount_to_proto(mount: NsMount, *, with_credentials: bool, pinned: list[str]) -> pb.MountInfo:
    options = mount.options
    return pb.MountInfo(
        path=mount.path,
        source=mount.source if with_credentials else shown_url(mount.source),
        mount_id=mount.mount_id,
        created_unix_ms=mount.created_unix_ms,
        pinned_prefixes=pinned,
        unusable=mount.unusable,
        options=pb.MountOptions(
            options=options.options,
            credentials=options.credentials if with_credentials and not mount.unusable else {},
            read_only=options.read_only,
            metadata_sync_interval=options.metadata_sync_interval,
            read_type=ReadType.proto_of(options.read_type),
            write_type=WriteType.proto_of(options.write_type),
            pin=options.pin,
            ttl_seconds=options.ttl_seconds,
            stale_if_error=options.stale_if_error,
        ),
    )


class FileInfos:
    """File entries as FileInfo messages, with the bytes of them the cache holds."""

    def __init__(self, config: ServerConfig, namespace: Namespace, blocks: BlockIndex) -> None:
        self.config = config
        self.namespace = namespace
        self.blocks = blocks

    def of(self, entry: FileEntry, *, reusable: bool = False) -> pb.FileInfo:
        """`entry` as a client gets it; `reusable`: an answer of GetStatus or ListStatus, with
        how long the client may reuse it (Namespace.valid_for)."""
        return self._made(pb.FileInfo, entry, self.namespace.valid_for(entry) if reusable else 0.0)

    def page(self, entries: Sequence[FileEntry]) -> pb.ListStatusResponse:
        """A page of a listing: each entry as `of` makes it (reusable), made in place in the
        page's message (not made, then copied in) with the page's reuse times reckoned
        together (Namespace.valid_for_each)."""
        response = pb.ListStatusResponse()
        add = response.files.add
        for entry, valid_for in zip(entries, self.namespace.valid_for_each(entries)):
            self._made(add, entry, valid_for)
        return response

    def _made(self, make: Callable[..., pb.FileInfo], entry: FileEntry, valid_for: float) -> pb.FileInfo:
        """The FileInfo of `entry`, reusable for `valid_for` seconds, as `make` (the message's
        class, or a repeated field's `add`) makes it from its fields."""
        file = not entry.is_dir
        return make(
            path=entry.path, name=entry.name, is_dir=entry.is_dir, length=entry.length,
            mtime_unix_ms=entry.mtime_unix_ms, version=entry.version, block_size=entry.block_size,
            persisted=entry.persisted, pinned=entry.pinned, mount_id=entry.mount_id, read_only=entry.read_only,
            store_version=entry.store_version,
            cached_bytes=self.blocks.cached_bytes_of_file(
                entry.mount_id, entry.path, entry.version, block_size=entry.block_size or self.config.block_size,
                file_length=entry.length) if file else 0,
            readahead_blocks=self.config.cache_policy.readahead_blocks if file else 0,
            valid_for_ms=int(valid_for * 1000),
        )
