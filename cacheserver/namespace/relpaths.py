"""Paths relative to a mount's root, as the stores see them: "" is the root, "a/b" a path in
it."""

from __future__ import annotations


def rel_under(path: str, root: str) -> bool:
    """`is_under` for paths relative to a mount root ("" = the root)."""
    return root == "" or path == root or path.startswith(root + "/")


def rel_parent(rel: str) -> str:
    return rel.rpartition("/")[0]
