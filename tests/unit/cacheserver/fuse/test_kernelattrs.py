"""What Strata remembers of the attributes the kernel holds, and when an open has the kernel
forget them (kernelattrs.py)."""

from __future__ import annotations

import stat

import pytest

from strata.cacheserver.fuse.kernelattrs import KernelAttrs
from strata.cacheserver.fuse.wire import Attr


def attr(size: int, mtime_ns: int = 1_000_000) -> Attr:
    return Attr(ino=7, mode=stat.S_IFREG | 0o444, size=size, mtime_ns=mtime_ns)


class Kernel:
    """Counts the invalidations asked for."""

    def __init__(self) -> None:
        self.invalidated = 0

    def invalidate(self) -> None:
        self.invalidated += 1


def test_an_open_of_what_the_kernel_was_told_invalidates_nothing() -> None:
    shown, kernel = KernelAttrs(), Kernel()
    shown.reply(5, attr(100), lambda: True)
    shown.ensure(5, attr(100), kernel.invalidate)
    shown.ensure(5, attr(100), kernel.invalidate)
    assert kernel.invalidated == 0


def test_an_open_of_another_size_or_time_or_an_unknown_node_invalidates_once() -> None:
    shown, kernel = KernelAttrs(), Kernel()
    shown.ensure(5, attr(100), kernel.invalidate)  # never told (a successor process)
    assert kernel.invalidated == 1
    shown.reply(5, attr(100), lambda: True)
    shown.ensure(5, attr(200), kernel.invalidate)  # grew in the store
    shown.reply(5, attr(200), lambda: True)  # the kernel asked again
    shown.ensure(5, attr(200), kernel.invalidate)
    shown.ensure(5, attr(200, mtime_ns=2_000_000), kernel.invalidate)  # the same size, another version
    assert kernel.invalidated == 3


def test_a_reply_the_kernel_did_not_take_is_not_remembered() -> None:
    shown, kernel = KernelAttrs(), Kernel()
    shown.reply(5, attr(100), lambda: True)
    shown.reply(5, attr(200), lambda: False)  # interrupted: the kernel still holds 100, or nothing
    shown.ensure(5, attr(200), kernel.invalidate)
    assert kernel.invalidated == 1


def test_sizes_the_kernel_sets_itself_are_not_trusted() -> None:
    shown, kernel = KernelAttrs(), Kernel()
    shown.reply(5, attr(100), lambda: True)
    shown.read_short(5, 100)  # a read to the end: the kernel keeps 100
    shown.ensure(5, attr(100), kernel.invalidate)
    assert kernel.invalidated == 0
    shown.read_short(5, 60)  # a read that ended before: the kernel takes 60 as the size
    shown.ensure(5, attr(100), kernel.invalidate)
    assert kernel.invalidated == 1
    shown.reply(5, attr(100), lambda: True)
    shown.forget(5)  # a write
    shown.ensure(5, attr(100), kernel.invalidate)
    assert kernel.invalidated == 2


def test_an_invalidation_that_fails_fails_the_open_and_is_tried_again() -> None:
    shown = KernelAttrs()
    shown.reply(5, attr(100), lambda: True)

    def refuse() -> None:
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        shown.ensure(5, attr(200), refuse)
    kernel = Kernel()
    shown.ensure(5, attr(200), kernel.invalidate)
    assert kernel.invalidated == 1
