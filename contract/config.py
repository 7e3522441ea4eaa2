"""The servers' settings file, `strata.yaml`: small typed models, one per concern.

Servers read it (`--config`, in Kubernetes the CacheCluster's ConfigMap key `strata.yaml`,
strata.cacheserver.config); the operator writes it with the same models, so the two never
disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import constants
from .modes import ReadType, WriteType
from .units import parse_size

Medium = Literal["MEM", "SSD", "HDD"]
Eviction = Literal["LRU", "LRFU"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class TierSettings(_Model):
    """One cache tier of a worker."""

    medium: Medium
    # Bytes this tier may hold. Must be > 0: a tier that can hold nothing is a mistake.
    quota: int = Field(gt=0)
    # Directories that hold the block files. MEM tiers default to a folder in /dev/shm so
    # block files can be handed to local readers as file descriptors.
    dirs: tuple[Path, ...] = ()

    @field_validator("quota", mode="before")
    @classmethod
    def _quota(cls, v: Any) -> int:
        return parse_size(v, what="tier quota")


class CachePolicySettings(_Model):
    """How blocks are cached, kept and evicted (CacheCluster spec.cachePolicy)."""

    eviction: Eviction = "LRU"
    read_type: ReadType = Field(ReadType.CACHE, alias="readType")
    write_type: WriteType = Field(WriteType.CACHE_THROUGH, alias="writeType")
    # Blocks fetched ahead of a sequential reader: two hides one store round trip per block.
    readahead_blocks: int = Field(2, ge=0, le=constants.MAX_READAHEAD_BLOCKS, alias="readaheadBlocks")
    # Evict down to low_watermark once a tier passes high_watermark (fractions of its quota).
    high_watermark: float = Field(0.95, gt=0, le=1, alias="highWatermark")
    low_watermark: float = Field(0.80, ge=0, lt=1, alias="lowWatermark")

    @model_validator(mode="after")
    def _watermarks(self) -> CachePolicySettings:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"lowWatermark ({self.low_watermark}) must be below highWatermark "
                f"({self.high_watermark})"
            )
        return self


class LocalSourcesSettings(_Model):
    """Folders of the servers' hosts that `file://` mounts may name (CacheCluster
    spec.localSources). Empty by default: a file:// source reads the host's own files, so
    only the cluster's owner may open that door, folder by folder."""

    # Absolute paths; a file:// source must be one of them or lie below one.
    allowed_roots: tuple[str, ...] = Field((), alias="allowedRoots")

    @field_validator("allowed_roots")
    @classmethod
    def _absolute(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        for root in roots:
            if not root.startswith("/"):
                raise ValueError(f"localSources.allowedRoots: {root!r} is not an absolute path")
        return roots


class DataPortSettings(_Model):
    """Connections of a worker's block sockets (the data port and the short-circuit socket).
    Each connection is served by a thread, so both bound what idle readers can hold."""

    # Connections served at once, per socket. One more is answered UNAVAILABLE and closed;
    # the reader then reads the block over gRPC. 256 covers many readers on one worker
    # (a client keeps one connection per reading thread) at ~256 threads at most.
    max_connections: int = Field(256, ge=1, alias="maxConnections")
    # Seconds a connection may wait for its next request, or a reader may take to accept
    # the next bytes of a reply, before the worker closes it. Readers reconnect on their
    # next request, so closing an idle one costs a connect.
    idle_timeout: float = Field(60.0, gt=0, alias="idleTimeout")


class ServerConfig(_Model):
    """The file both master and workers read (`strata.yaml`)."""

    # Size of a cached block: 16 MiB keeps per-block overhead (one store request, one
    # metadata entry) small while a partial read of a file still caches little extra.
    block_size: int = Field(constants.DEFAULT_BLOCK_SIZE, gt=0, alias="blockSize")
    # Where workers and clients find the master (host:port).
    master_address: str = Field(f"127.0.0.1:{constants.MASTER_RPC_PORT}", alias="masterAddress")
    tiers: tuple[TierSettings, ...] = ()
    cache_policy: CachePolicySettings = Field(
        default_factory=lambda: CachePolicySettings.model_validate({}), alias="cachePolicy"
    )
    # Clients on a worker's host read block files through a passed file descriptor.
    short_circuit: bool = Field(True, alias="shortCircuit")
    # Seconds between worker heartbeats, and how many missed ones drop a worker from placement.
    heartbeat_interval: float = Field(1.0, gt=0, alias="heartbeatInterval")
    heartbeat_misses: int = Field(5, ge=1, alias="heartbeatMisses")
    # Seconds a worker keeps the blocks of a mount the master's mount table lacks before it
    # frees them (blocks holding writes never persisted excepted; worker/retention.py). 900:
    # longer than a master pod takes to come back on another node with its journal volume
    # (Kubernetes force-detaches a volume from a lost node after 6 minutes), so a master seen
    # meanwhile without its mounts costs no cached data; short enough that the blocks of a
    # mount forgotten with an emptyDir journal stop holding capacity within a quarter hour.
    orphan_block_grace: float = Field(900.0, ge=0, alias="orphanBlockGrace")
    data_port: DataPortSettings = Field(
        default_factory=lambda: DataPortSettings.model_validate({}), alias="dataPort"
    )
    local_sources: LocalSourcesSettings = Field(
        default_factory=lambda: LocalSourcesSettings.model_validate({}), alias="localSources"
    )

    @field_validator("block_size", mode="before")
    @classmethod
    def _block_size(cls, v: Any) -> int:
        return parse_size(v, what="blockSize")

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, tiers: tuple[TierSettings, ...]) -> tuple[TierSettings, ...]:
        media = [t.medium for t in tiers]
        if len(set(media)) != len(media):
            raise ValueError(f"tiers: at most one tier of each medium, got {media}")
        order = [constants.MEDIA.index(m) for m in media]
        if order != sorted(order):
            raise ValueError(f"tiers: list them fastest first (MEM, SSD, HDD), got {media}")
        return tiers

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json", by_alias=True)
        return yaml.safe_dump(data, sort_keys=False)
