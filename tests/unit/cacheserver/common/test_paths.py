from __future__ import annotations

import pytest

from strata.cacheserver.common.paths import check_limits, is_under, join, name, normalize, overlaps, parent, received, relative
from strata.contract.constants import MAX_NAME_BYTES, MAX_PATH_BYTES
from strata.contract.errors import InvalidArgument


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/", "/"),
        ("//", "/"),
        ("/a", "/a"),
        ("/a/", "/a"),
        ("//a//b///", "/a/b"),
        ("/a/./b/.", "/a/b"),
        ("/a/b/../c", "/a/c"),
        ("/a/..", "/"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


def test_relative_paths_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="mount path must be absolute, got 'data/x'"):
        normalize("data/x", what="mount path")
    with pytest.raises(InvalidArgument, match="path must be absolute, got ''"):
        normalize("")


@pytest.mark.parametrize("raw", ["/..", "/a/../..", "/../etc"])
def test_dotdot_above_root_is_refused(raw: str) -> None:
    with pytest.raises(InvalidArgument, match="climbs above /"):
        normalize(raw)


def test_is_under_and_overlaps_respect_component_boundaries() -> None:
    assert is_under("/a/b", "/a") and is_under("/a", "/a") and is_under("/x", "/")
    assert not is_under("/ab", "/a") and not is_under("/a", "/a/b")
    assert overlaps("/a", "/a/b") and overlaps("/a/b", "/a") and overlaps("/a", "/a")
    assert not overlaps("/a", "/ab") and not overlaps("/a/b", "/a/c")


def test_relative_join_parent_name() -> None:
    assert relative("/a/b/c", "/a") == "b/c"
    assert relative("/a", "/a") == ""
    assert relative("/a/b", "/") == "a/b"
    with pytest.raises(InvalidArgument, match="is not under"):
        relative("/b", "/a")
    assert join("/a", "b/c") == "/a/b/c" and join("/a", "") == "/a" and join("/", "x") == "/x"
    assert parent("/a/b") == "/a" and parent("/a") == "/" and parent("/") == "/"
    assert name("/a/b") == "b" and name("/") == ""


def test_a_nul_byte_is_refused_with_the_path() -> None:
    with pytest.raises(InvalidArgument, match=r"'/a\\x00b' contains a NUL byte"):
        normalize("/a\0b")


def test_names_and_paths_over_the_limits_are_refused_naming_the_limit() -> None:
    assert received("/a/" + "n" * MAX_NAME_BYTES) == "/a/" + "n" * MAX_NAME_BYTES
    with pytest.raises(InvalidArgument, match=f"name of {MAX_NAME_BYTES + 1} bytes.*at most {MAX_NAME_BYTES} bytes"):
        received("/a/" + "n" * (MAX_NAME_BYTES + 1) + "/b")
    # Bytes of UTF-8, not characters: 128 two-byte characters are 256 bytes.
    with pytest.raises(InvalidArgument, match="name of 256 bytes"):
        check_limits("/" + "é" * 128)
    fits = "/" + "/".join(["d" * 200] * 20)[:MAX_PATH_BYTES - 1]
    check_limits(fits)
    with pytest.raises(InvalidArgument, match=f"is 65536 bytes long: a path may have at most {MAX_PATH_BYTES}") as refused:
        received("/" + "/".join(["d" * 255] * 256)[:65536])
    assert len(str(refused.value)) < 300  # the message shows the path's start, not all of it
