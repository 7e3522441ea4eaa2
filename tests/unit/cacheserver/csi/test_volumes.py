"""From volume attributes and secrets to the data a volume shows."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from strata.cacheserver.csi.proto import csi_pb2 as csi
from strata.cacheserver.csi.volumes import (
    VolumeSource,
    capability_problem,
    check_capabilities,
    source_of,
    volume_context,
    volume_id_for,
    wants_read_only,
)
from strata.contract import csi as c
from strata.contract.errors import InvalidArgument, NotFound

Mode = csi.VolumeCapability.AccessMode


class Mounts:
    """A MountResolver over a dict: (namespace, name) -> source."""

    def __init__(self, mounts: dict[tuple[str, str], VolumeSource]) -> None:
        self.mounts = mounts
        self.secrets_seen: list[Mapping[str, str]] = []

    def resolve(self, namespace: str, name: str, secrets: Mapping[str, str], requester: str) -> VolumeSource:
        self.secrets_seen.append(secrets)
        try:
            return self.mounts[(namespace, name)]
        except KeyError:
            raise NotFound(f"Mount {namespace}/{name} does not exist") from None


DATA = VolumeSource(master="m:19998", token="t", path="/datasets/x", name="Mount team/data")
RESOLVER = Mounts({("team", "data"): DATA})


def test_an_inline_volume_names_a_mount_in_the_pods_namespace() -> None:
    attributes = {c.ATTR_MOUNT: "data", c.POD_NAMESPACE: "team", "csi.storage.k8s.io/ephemeral": "true"}
    assert source_of(attributes, {}, RESOLVER) == DATA


def test_an_explicit_namespace_wins_and_subpath_goes_below_the_mount() -> None:
    attributes = {c.ATTR_MOUNT: "data", c.ATTR_NAMESPACE: "team", c.POD_NAMESPACE: "other", c.ATTR_SUBPATH: "train/"}
    source = source_of(attributes, {c.SECRET_TOKEN: "given"}, RESOLVER)
    assert source.path == "/datasets/x/train"
    assert RESOLVER.secrets_seen[-1] == {c.SECRET_TOKEN: "given"}  # the resolver may take the token from there


def test_a_subpath_cannot_climb_out_of_the_mount() -> None:
    with pytest.raises(InvalidArgument, match="subPath"):
        source_of({c.ATTR_MOUNT: "data", c.ATTR_NAMESPACE: "team", c.POD_NAMESPACE: "team",
                   c.ATTR_SUBPATH: "../../etc"}, {}, RESOLVER)


def test_a_mount_without_a_namespace_says_how_to_get_one() -> None:
    with pytest.raises(InvalidArgument, match="podInfoOnMount"):
        source_of({c.ATTR_MOUNT: "data"}, {}, RESOLVER)


def test_a_mount_volume_without_the_asking_namespace_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="which namespace asks.*podInfoOnMount"):
        source_of({c.ATTR_MOUNT: "data", c.ATTR_NAMESPACE: "team"}, {}, RESOLVER)


def test_an_unknown_mount_is_not_found() -> None:
    with pytest.raises(NotFound, match="team/nope"):
        source_of({c.ATTR_MOUNT: "nope", c.POD_NAMESPACE: "team"}, {}, RESOLVER)


def test_a_volume_can_name_a_master_and_path_with_the_token_as_a_secret() -> None:
    attributes = {c.ATTR_MASTER: "10.0.0.1:19998", c.ATTR_PATH: "/logs//2024/", c.ATTR_READ_ONLY: "True",
                  c.ATTR_WRITE_TYPE: "THROUGH"}
    source = source_of(attributes, {c.SECRET_TOKEN: "secret"}, RESOLVER)
    assert (source.master, source.token, source.path, source.read_only, source.write_type) == (
        "10.0.0.1:19998", "secret", "/logs/2024", True, "THROUGH")
    assert "secret" not in repr(source)


def test_a_volume_asks_for_passthrough_with_true_and_a_word_that_is_not_a_flag_is_refused() -> None:
    attributes = {c.ATTR_MASTER: "m:1", c.ATTR_PATH: "/x"}
    secrets = {c.SECRET_TOKEN: "t"}
    assert not source_of(attributes, secrets, RESOLVER).passthrough
    assert not source_of({**attributes, c.ATTR_PASSTHROUGH: "false"}, secrets, RESOLVER).passthrough
    assert source_of({**attributes, c.ATTR_PASSTHROUGH: "True"}, secrets, RESOLVER).passthrough
    with pytest.raises(InvalidArgument, match=r"passthrough 'yes'.*\"true\""):
        source_of({**attributes, c.ATTR_PASSTHROUGH: "yes"}, secrets, RESOLVER)
    with pytest.raises(InvalidArgument, match="readOnly 'on'"):
        source_of({**attributes, c.ATTR_READ_ONLY: "on"}, secrets, RESOLVER)


@pytest.mark.parametrize(("attributes", "secrets", "message"), [
    ({c.ATTR_MASTER: "m:1"}, {c.SECRET_TOKEN: "t"}, "no `path`"),
    ({c.ATTR_MASTER: "m:1", c.ATTR_PATH: "/x"}, {}, "nodePublishSecretRef"),
    ({c.ATTR_MASTER: "m:1", c.ATTR_PATH: "relative"}, {c.SECRET_TOKEN: "t"}, "absolute"),
    ({c.ATTR_MASTER: "m:1", c.ATTR_PATH: "/x", c.ATTR_WRITE_TYPE: "FAST"}, {c.SECRET_TOKEN: "t"}, "FAST"),
    ({"foo": "bar", c.POD_NAMESPACE: "team"}, {}, r"\['foo'\]"),
])
def test_incomplete_attributes_say_what_is_missing(attributes: dict[str, str], secrets: dict[str, str],
                                                   message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        source_of(attributes, secrets, RESOLVER)


def capability(mode: int = Mode.SINGLE_NODE_WRITER, *, block: bool = False, access: bool = True) -> csi.VolumeCapability:
    cap = csi.VolumeCapability(access_mode=Mode(mode=mode))
    if block:
        cap.block.SetInParent()
    elif access:
        cap.mount.SetInParent()
    return cap


def test_file_system_capabilities_are_served_and_block_is_not() -> None:
    check_capabilities([capability(), capability(Mode.MULTI_NODE_READER_ONLY)])
    assert capability_problem(capability(block=True)) is not None
    assert capability_problem(capability(access=False)) is not None
    assert capability_problem(capability(Mode.UNKNOWN)) is not None
    with pytest.raises(InvalidArgument, match="block access"):
        check_capabilities([capability(), capability(block=True)])
    with pytest.raises(InvalidArgument, match="missing"):
        check_capabilities([])


def test_reader_only_access_modes_mount_read_only() -> None:
    assert wants_read_only(capability(Mode.SINGLE_NODE_READER_ONLY))
    assert wants_read_only(capability(Mode.MULTI_NODE_READER_ONLY))
    assert not wants_read_only(capability(Mode.MULTI_NODE_MULTI_WRITER))


def test_volume_ids_are_stable_per_name_and_short() -> None:
    assert volume_id_for("pvc-1") == volume_id_for("pvc-1") != volume_id_for("pvc-2")
    assert volume_id_for("x" * 128).startswith(c.VOLUME_ID_PREFIX)
    assert len(volume_id_for("x" * 128)) < 128


def test_provisioned_volumes_keep_the_parameters_and_the_pvcs_namespace() -> None:
    parameters = {c.ATTR_MOUNT: "data", c.PVC_NAMESPACE: "team", "csi.storage.k8s.io/pvc/name": "claim"}
    assert volume_context(parameters) == {c.ATTR_MOUNT: "data", c.ATTR_NAMESPACE: "team"}
    direct = {c.ATTR_MASTER: "m:1", c.ATTR_PATH: "/x"}
    assert volume_context(direct) == direct
