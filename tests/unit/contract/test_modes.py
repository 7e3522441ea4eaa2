"""ReadType and WriteType: one spelling (the CRDs'), and every conversion to and from the
gRPC enum, the wire number and the "unspecified" empty string."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from strata.contract.config import CachePolicySettings
from strata.contract.modes import ReadType, WriteType
from strata.contract.proto import strata_pb2 as pb

CRDS = Path(__file__).resolve().parents[3] / "crds"


def test_the_types_are_the_proto_enums_without_unspecified() -> None:
    assert list(ReadType) == [n for n in pb.ReadType.keys() if n != "READ_TYPE_UNSPECIFIED"]
    assert list(WriteType) == [n for n in pb.WriteType.keys() if n != "WRITE_TYPE_UNSPECIFIED"]


def _enums(crd: str, field: str) -> list[list[str]]:
    found: list[list[str]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == field and isinstance(value, dict) and "enum" in value:
                    found.append(value["enum"])
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(yaml.safe_load((CRDS / crd).read_text()))
    return found


@pytest.mark.parametrize("crd", ["cacheclusters.strata.dev.yaml", "mounts.strata.dev.yaml"])
def test_the_crds_spell_them_the_same(crd: str) -> None:
    assert _enums(crd, "readType") == [list(ReadType)]
    assert _enums(crd, "writeType") == [list(WriteType)]


@pytest.mark.parametrize("kind", [ReadType, WriteType])
def test_every_type_round_trips_through_the_proto_enum(kind: type[ReadType] | type[WriteType]) -> None:
    for member in kind:
        value = member.to_proto()
        assert kind.from_proto(value) is member  # type: ignore[arg-type]
        assert kind.name_of(value) == member.value  # type: ignore[arg-type]
        assert kind.proto_of(member.value) == value


def test_unspecified_is_the_empty_string_and_zero() -> None:
    assert ReadType.proto_of("") == ReadType.proto_of(None) == pb.READ_TYPE_UNSPECIFIED == 0
    assert WriteType.proto_of("") == pb.WRITE_TYPE_UNSPECIFIED == 0
    assert ReadType.from_proto(pb.READ_TYPE_UNSPECIFIED) is None and ReadType.name_of(pb.READ_TYPE_UNSPECIFIED) == ""
    assert WriteType.from_proto(pb.WRITE_TYPE_UNSPECIFIED) is None and WriteType.name_of(pb.WRITE_TYPE_UNSPECIFIED) == ""


def test_the_wire_number_is_the_enum() -> None:
    assert ReadType.from_wire(int(pb.CACHE_PROMOTE)) == pb.CACHE_PROMOTE
    assert ReadType.from_wire(0) == pb.READ_TYPE_UNSPECIFIED


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError):
        ReadType.proto_of("CACHE_EVERYTHING")
    with pytest.raises(ValueError):
        WriteType.proto_of("WRITE_TYPE_UNSPECIFIED")


def test_strata_yaml_keeps_the_names() -> None:
    policy = CachePolicySettings.model_validate({"readType": "NO_CACHE", "writeType": "ASYNC_THROUGH"})
    assert policy.read_type is ReadType.NO_CACHE and policy.write_type is WriteType.ASYNC_THROUGH
    dumped = policy.model_dump(mode="json", by_alias=True)
    assert dumped["readType"] == "NO_CACHE" and dumped["writeType"] == "ASYNC_THROUGH"
    assert type(dumped["readType"]) is str
