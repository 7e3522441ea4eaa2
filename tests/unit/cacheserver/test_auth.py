"""Credentials and the method->role table."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from strata.cacheserver import auth
from strata.cacheserver.auth import BLOCK_SOCKET, METHOD_ROLES, Credentials, Role, check_access
from strata.contract.errors import InvalidArgument
from strata.contract.proto import strata_pb2 as pb

CREDENTIALS = Credentials(admin="a" * 8, data="d" * 8, internal="i" * 8)


def all_methods() -> list[str]:
    return [f"/{service.full_name}/{method.name}"
            for service in pb.DESCRIPTOR.services_by_name.values() for method in service.methods]


def test_every_rpc_has_a_role_and_the_table_names_no_other() -> None:
    assert set(all_methods()) | {BLOCK_SOCKET} == set(METHOD_ROLES)


@pytest.mark.parametrize(("method", "roles"), [
    ("/strata.v1.Master/GetMountTable", {Role.INTERNAL}),  # the stores' credentials
    ("/strata.v1.Master/Mount", {Role.ADMIN}),
    ("/strata.v1.Master/Free", {Role.ADMIN}),
    ("/strata.v1.Master/Load", {Role.ADMIN}),
    ("/strata.v1.Master/SetPinned", {Role.ADMIN}),
    ("/strata.v1.Master/Report", {Role.ADMIN}),
    ("/strata.v1.Master/CommitFile", {Role.INTERNAL}),
    ("/strata.v1.Worker/PinBlocks", {Role.INTERNAL}),
    ("/strata.v1.Master/PersistFile", {Role.INTERNAL}),
    ("/strata.v1.Master/GetStatus", {Role.DATA, Role.ADMIN, Role.INTERNAL}),
    ("/strata.v1.Worker/WriteFile", {Role.DATA, Role.ADMIN, Role.INTERNAL}),
    (BLOCK_SOCKET, {Role.DATA, Role.ADMIN, Role.INTERNAL}),
])
def test_who_may_call_what(method: str, roles: set[Role]) -> None:
    for role, token in ((Role.ADMIN, "a" * 8), (Role.DATA, "d" * 8), (Role.INTERNAL, "i" * 8)):
        refusal = check_access(CREDENTIALS, method, token)
        assert (refusal is None) == (role in roles), (method, role)
        if refusal is not None:
            assert refusal[0] == grpc.StatusCode.PERMISSION_DENIED
            assert f"carries the {role.value} credential" in refusal[1]


def test_unknown_tokens_and_unknown_methods_are_refused() -> None:
    assert check_access(CREDENTIALS, "/strata.v1.Master/GetStatus", "nope")[0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]
    assert check_access(CREDENTIALS, "/strata.v1.Master/GetStatus", None)[0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]
    refusal = check_access(CREDENTIALS, "/strata.v1.Master/NotYetInTheTable", "a" * 8)
    assert refusal == (grpc.StatusCode.PERMISSION_DENIED, "/strata.v1.Master/NotYetInTheTable is not open to any caller")


def test_derived_tokens_differ_per_role_and_from_the_admin_one() -> None:
    credentials = Credentials.from_admin("admin-token")
    assert len({credentials.admin, credentials.data, credentials.internal}) == 3
    assert credentials == Credentials.from_admin("admin-token")  # every server derives the same
    with pytest.raises(InvalidArgument, match="must differ"):
        Credentials(admin="same", data="same", internal="other")


def test_servers_and_clients_find_their_tokens(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in auth.CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidArgument, match="no admin token"):
        auth.load_credentials()
    with pytest.raises(InvalidArgument, match="STRATA_DATA_TOKEN"):
        auth.load_token()
    (tmp_path / "data").write_text("data-from-file\n")
    monkeypatch.setenv("STRATA_DATA_TOKEN_FILE", str(tmp_path / "data"))
    assert auth.load_token() == "data-from-file"  # a pod with only the data credential
    monkeypatch.setenv("STRATA_TOKEN", "admin")
    assert auth.load_token() == "admin"  # the admin one wins
    credentials = auth.load_credentials()
    assert (credentials.admin, credentials.data) == ("admin", "data-from-file")
    assert credentials.internal == auth.derive_token("admin", Role.INTERNAL)
    monkeypatch.setenv("STRATA_INTERNAL_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="STRATA_INTERNAL_TOKEN_FILE=.*cannot be read"):
        auth.load_credentials()
