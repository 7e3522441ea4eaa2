"""Namespace paths: absolute, `/`-separated, normalized (`/a/b`, never `/a/b/`, `//a`, `/a/./b`)."""

from __future__ import annotations

from google.protobuf.message import Message

from strata.contract.constants import MAX_NAME_BYTES, MAX_PATH_BYTES
from strata.contract.errors import InvalidArgument

# How much of a path an error message shows: a message travels in a reply's trailing
# metadata, which gRPC bounds (8 KiB), so it never holds a whole long path.
SHOWN_CHARS = 80


def shown(path: str) -> str:
    """`path` for a message: quoted, and cut to its first SHOWN_CHARS characters."""
    if len(path) <= SHOWN_CHARS:
        return repr(path)
    return f"{path[:SHOWN_CHARS]!r}... ({len(path)} characters)"


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_limits(path: str, *, what: str = "path") -> None:
    """InvalidArgument (naming `what` and the limit) when `path` is longer than
    MAX_PATH_BYTES or one of its names longer than MAX_NAME_BYTES, in bytes of UTF-8."""
    size = _bytes(path)
    if size > MAX_PATH_BYTES:
        raise InvalidArgument(f"{what} {shown(path)} is {size} bytes long: a path may have at most "
                              f"{MAX_PATH_BYTES} bytes (MAX_PATH_BYTES)")
    if size <= MAX_NAME_BYTES:
        return
    for part in path.split("/"):
        if _bytes(part) > MAX_NAME_BYTES:
            raise InvalidArgument(f"{what} {shown(path)} has a name of {_bytes(part)} bytes ({shown(part)}): a name "
                                  f"may have at most {MAX_NAME_BYTES} bytes (MAX_NAME_BYTES)")


# The fields of a request that hold namespace paths.
PATH_FIELDS = ("path", "src", "dst")


def check_request_paths(request: Message) -> None:
    """check_limits on each of a request's PATH_FIELDS: a client's check before it sends."""
    fields = request.DESCRIPTOR.fields_by_name
    for name in PATH_FIELDS:
        if name in fields:
            check_limits(getattr(request, name), what=name)


def received(path: str, *, what: str = "path") -> str:
    """A path as a request carries it, normalized: InvalidArgument when it is over the
    namespace's limits (`check_limits`) or `normalize` refuses it. Servers take every path of
    a request through this; paths a store lists are not refused here."""
    check_limits(path, what=what)
    return normalize(path, what=what)


def normalize(path: str, *, what: str = "path") -> str:
    """The canonical form of an absolute path: `//` and `.` collapsed, `..` resolved, no
    trailing slash except for "/". InvalidArgument (naming `what`) for relative paths, for
    paths with a NUL byte and for `..` that would climb above "/"."""
    if not path.startswith("/"):
        raise InvalidArgument(f"{what} must be absolute, got {shown(path)}")
    if "\0" in path:
        raise InvalidArgument(f"{what} {shown(path)} contains a NUL byte, which no file name may hold")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise InvalidArgument(f"{what} {shown(path)} climbs above / with '..'")
            parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)


def is_under(path: str, root: str) -> bool:
    """True if `path` is `root` or below it (both normalized)."""
    if root == "/":
        return True
    return path == root or path.startswith(root + "/")


def overlaps(a: str, b: str) -> bool:
    """True if one of the two paths is the other or below it."""
    return is_under(a, b) or is_under(b, a)


def relative(path: str, root: str) -> str:
    """`path` relative to `root` ("" for root itself, no leading slash)."""
    if not is_under(path, root):
        raise InvalidArgument(f"path {path!r} is not under {root!r}")
    if path == root:
        return ""
    return path[len(root):].lstrip("/")


def join(root: str, rel: str) -> str:
    """The namespace path of `rel` below `root`."""
    if not rel:
        return root
    return f"{root.rstrip('/')}/{rel}"


def parent(path: str) -> str:
    """The directory holding `path` ("/" for "/" itself)."""
    if path == "/":
        return "/"
    head = path.rsplit("/", 1)[0]
    return head or "/"


def name(path: str) -> str:
    """The last component ("" for "/")."""
    return path.rsplit("/", 1)[-1]
