"""Which paths of a mount clients may change: not the mount point itself, nothing in a
read-only mount, nothing in Strata's own upload folder in the store (where ASYNC_THROUGH
uploads land first) nor its uploads' temporary files elsewhere."""

from __future__ import annotations

from strata.contract.constants import UPLOAD_DIR
from strata.contract.errors import InvalidArgument, PermissionDenied
from ..ufs import is_upload_temp
from ..common.paths import name
from .relpaths import rel_under


def upload_rel(version: str) -> str:
    """Where the ASYNC_THROUGH upload of a written version lands first, relative to the
    mount's root."""
    return f"{UPLOAD_DIR}/{version}"


def is_upload_path(rel: str) -> bool:
    """Paths of Strata's own upload folder, and of uploads' temporary files written in
    another folder (`ufs.is_upload_temp`), never shown or served as the mount's files."""
    return rel_under(rel, UPLOAD_DIR) or is_upload_temp(rel.rpartition("/")[2])


def check_writable(path: str, rel: str, *, mount_path: str, read_only: bool, action: str) -> None:
    """Refuse a client's change (`action`, e.g. "write") of `path`, `rel` in the mount at
    `mount_path`, where clients may not change anything: the mount point itself, a read-only
    mount, the store's upload folder (where ASYNC_THROUGH files wait to be moved into place:
    a file put there could stand in for another writer's acknowledged bytes)."""
    if rel == "":
        raise InvalidArgument(f"{path} is a mount point; cannot {action} it (unmount it instead)")
    if read_only:
        raise PermissionDenied(f"mount {mount_path} is read-only; cannot {action} {path}")
    if is_upload_path(rel):
        raise PermissionDenied(
            f"cannot {action} {path}: {UPLOAD_DIR} is Strata's own upload folder in the store, and names like "
            f"{name(path)!r} its uploads' temporary files, closed to clients"
        )
