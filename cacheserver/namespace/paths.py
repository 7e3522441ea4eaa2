"""Namespace paths: absolute, `/`-separated, normalized (`/a/b`, never `/a/b/`, `//a`, `/a/./b`)."""

from __future__ import annotations

from strata.contract.errors import InvalidArgument


def normalize(path: str, *, what: str = "path") -> str:
    """The canonical form of an absolute path: `//` and `.` collapsed, `..` resolved, no
    trailing slash except for "/". InvalidArgument (naming `what`) for relative paths, for
    paths with a NUL byte and for `..` that would climb above "/"."""
    if not path.startswith("/"):
        raise InvalidArgument(f"{what} must be absolute, got {path!r}")
    if "\0" in path:
        raise InvalidArgument(f"{what} {path!r} contains a NUL byte, which no file name may hold")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise InvalidArgument(f"{what} {path!r} climbs above / with '..'")
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
