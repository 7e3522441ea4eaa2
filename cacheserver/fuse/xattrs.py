"""The extended attributes of a FUSE mount: `user.strata.locations` lists the hosts holding
each block of a file (see locations.py); no other is kept, and none can be set."""

from __future__ import annotations

import errno

from strata.contract.constants import XATTR_LOCATIONS
from .errnos import as_errno
from .interface import FuseError
from .locations import format_locations
from .state import OperationsState

ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)



class ExtendedAttributes(OperationsState):
    @as_errno
    def listxattr(self, path: str) -> list[str]:
        ns = self._ns(path)
        if self._writers(ns) or not self._info(ns).is_dir:
            return [XATTR_LOCATIONS]
        return []

    @as_errno
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        ns = self._ns(path)
        if name != XATTR_LOCATIONS:
            raise FuseError(ENOATTR)
        if self._writers(ns):
            return b""  # not written to the cache yet
        if self._info(ns).is_dir:
            raise FuseError(ENOATTR)
        return format_locations(self.client.block_locations(ns).blocks).encode()

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        raise FuseError(errno.ENOTSUP)

    def removexattr(self, path: str, name: str) -> int:
        raise FuseError(errno.ENOTSUP)
