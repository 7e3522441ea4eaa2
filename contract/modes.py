"""The read and write types, in one form with every conversion.

A type is spelled as in the CRDs and strata.yaml (`CACHE`, `ASYNC_THROUGH`); the gRPC
protocol carries it as its enum, and the data port as that enum's number. "Unspecified" (the
mount's or the cluster's default) is the empty string in mount options and flags, and the
enum's zero on the wire.
"""

from __future__ import annotations

from enum import StrEnum

from .proto import strata_pb2 as pb


class ReadType(StrEnum):
    CACHE = "CACHE"                  # cache in the tier the block lands in
    CACHE_PROMOTE = "CACHE_PROMOTE"  # cache, and move a hit block up to the fastest tier
    NO_CACHE = "NO_CACHE"            # read from the store without caching

    def to_proto(self) -> pb.ReadType.ValueType:
        return pb.ReadType.Value(self.value)

    @classmethod
    def from_proto(cls, value: pb.ReadType.ValueType) -> ReadType | None:
        """None for READ_TYPE_UNSPECIFIED."""
        return None if value == pb.READ_TYPE_UNSPECIFIED else cls(pb.ReadType.Name(value))

    @classmethod
    def proto_of(cls, name: str | None) -> pb.ReadType.ValueType:
        """The enum of a name as people write it; "" (or None): unspecified. Raises
        ValueError for a name that is not a read type."""
        return cls(name).to_proto() if name else pb.READ_TYPE_UNSPECIFIED

    @classmethod
    def name_of(cls, value: pb.ReadType.ValueType) -> str:
        """The name of an enum value; "" for unspecified."""
        found = cls.from_proto(value)
        return found.value if found is not None else ""

    @staticmethod
    def from_wire(value: int) -> pb.ReadType.ValueType:
        """The enum of the number a data-port request carries."""
        return pb.ReadType.ValueType(value)


class WriteType(StrEnum):
    MUST_CACHE = "MUST_CACHE"        # cache only; never persisted to the store
    CACHE_THROUGH = "CACHE_THROUGH"  # write the store and the cache before returning
    THROUGH = "THROUGH"              # write the store only
    ASYNC_THROUGH = "ASYNC_THROUGH"  # cache now, persist to the store in the background

    def to_proto(self) -> pb.WriteType.ValueType:
        return pb.WriteType.Value(self.value)

    @classmethod
    def from_proto(cls, value: pb.WriteType.ValueType) -> WriteType | None:
        """None for WRITE_TYPE_UNSPECIFIED."""
        return None if value == pb.WRITE_TYPE_UNSPECIFIED else cls(pb.WriteType.Name(value))

    @classmethod
    def proto_of(cls, name: str | None) -> pb.WriteType.ValueType:
        """The enum of a name as people write it; "" (or None): unspecified. Raises
        ValueError for a name that is not a write type."""
        return cls(name).to_proto() if name else pb.WRITE_TYPE_UNSPECIFIED

    @classmethod
    def name_of(cls, value: pb.WriteType.ValueType) -> str:
        """The name of an enum value; "" for unspecified."""
        found = cls.from_proto(value)
        return found.value if found is not None else ""
