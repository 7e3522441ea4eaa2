"""The errno a caller of a system call on a FUSE mount sees for each of Strata's errors, and
the decorator that turns whatever an operation raises into one (a FuseError)."""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from strata.contract.errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    StrataError,
    Unauthenticated,
    Unavailable,
)
from .interface import FuseError

log = logging.getLogger("strata.fuse")

_ERRNO = {
    NotFound: errno.ENOENT,
    AlreadyExists: errno.EEXIST,
    PermissionDenied: errno.EACCES,
    Unauthenticated: errno.EACCES,
    InvalidArgument: errno.EINVAL,
    ResourceExhausted: errno.ENOSPC,
    Unavailable: errno.EIO,
    DataLoss: errno.EIO,
    FailedPrecondition: errno.EIO,
}


def errno_of(exc: StrataError) -> int:
    for cls, code in _ERRNO.items():
        if isinstance(exc, cls):
            return code
    return errno.EIO


F = TypeVar("F", bound=Callable[..., Any])


def as_errno(fn: F) -> F:
    """Turn the client's errors into the errno the caller of the system call sees."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any) -> Any:
        try:
            return fn(self, *args)
        except FuseError:
            raise
        except StrataError as exc:
            code = errno_of(exc)
            (log.debug if code == errno.ENOENT else log.warning)("%s%r: %s", fn.__name__, args[:1], exc)
            raise FuseError(code) from exc
        except IsADirectoryError as exc:
            raise FuseError(errno.EISDIR) from exc
        except OSError as exc:
            if exc.errno:
                raise
            log.exception("%s%r failed", fn.__name__, args[:1])
            raise FuseError(errno.EIO) from exc
        except Exception as exc:
            log.exception("%s%r failed", fn.__name__, args[:1])
            raise FuseError(errno.EIO) from exc

    return wrapper  # type: ignore[return-value]
