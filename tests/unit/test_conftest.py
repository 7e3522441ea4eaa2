"""The shared hook that explains a failed comparison of long byte strings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).parents[1] / "conftest.py")
assert _spec and _spec.loader
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


def test_long_byte_strings_are_explained_by_their_first_difference() -> None:
    left = bytes(1 << 20)
    right = bytearray(left)
    right[700_000] = 1
    lines = hooks.pytest_assertrepr_compare("==", left, right)
    assert lines is not None
    assert "first difference at offset 700000" in lines


def test_a_prefix_differs_where_the_shorter_one_ends() -> None:
    assert hooks.first_difference(b"a" * 5000, b"a" * 6000) == 5000
    assert hooks.first_difference(b"abc", b"abc") == -1


def test_short_byte_strings_and_other_comparisons_keep_pytests_own_explanation() -> None:
    assert hooks.pytest_assertrepr_compare("==", b"abc", b"abd") is None
    assert hooks.pytest_assertrepr_compare("!=", bytes(10_000), bytes(10_001)) is None
    assert hooks.pytest_assertrepr_compare("==", "x" * 10_000, "y" * 10_000) is None
