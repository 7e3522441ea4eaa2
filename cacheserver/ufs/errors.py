"""How a store's failures become Strata's errors: the one table of S3 error codes and of
exception types that say "try again", "no such file" or "not with these credentials"."""

from __future__ import annotations

import errno
from collections.abc import Callable

import aiohttp
import botocore.exceptions
from botocore.parsers import ResponseParserError
from fsspec.exceptions import FSTimeoutError

from strata.contract.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StrataError,
    Unavailable,
)

# S3 error codes that mean "these credentials are not accepted here".
_CREDENTIAL_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "InvalidClientTokenId", "AllAccessDisabled", "AccountProblem",
    "RequestTimeTooSkewed", "403",
})
# S3 error codes that go away by themselves: throttling and server-side trouble.
_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
    "ThrottlingException", "RequestLimitExceeded", "OperationAborted",
})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
# Exceptions that say "the store could not be reached or did not answer in time".
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    FSTimeoutError,
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    ResponseParserError,
)


class VersionChanged(FailedPrecondition):
    """A read of one version of a file found another one in the store."""


class _ShortAnswer(Unavailable):
    """A store answered an exact read with another number of bytes than asked for."""


def _client_error(exc: BaseException) -> botocore.exceptions.ClientError | None:
    """The S3 error behind `exc` (s3fs re-raises them as OSError subclasses), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, botocore.exceptions.ClientError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def s3_error(exc: BaseException) -> tuple[str, int] | None:
    """The code and HTTP status of the S3 error behind `exc`, if any."""
    error = _client_error(exc)
    if error is None:
        return None
    return (str(error.response.get("Error", {}).get("Code", "")),
            int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0))


def translate(exc: Exception, what: str, url: str, *, store: str, bucket: str, where: Callable[[], str]) -> Exception:
    """The Strata error for a failure of `what` of `url` in the store shown as `store` (whose
    bucket, on S3, is `bucket`; reached at `where()`), or `exc` itself when none fits."""
    if isinstance(exc, StrataError):
        return exc
    client_error = _client_error(exc)
    if client_error is not None:
        error = client_error.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", "")) or str(client_error)
        status = int(client_error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code == "NoSuchBucket":
            return NotFound(
                f"bucket {bucket!r} does not exist ({url}); create it or fix the Mount's source"
            )
        if code in _CREDENTIAL_CODES or status == 403:
            return PermissionDenied(
                f"store {store} refused the credentials: {code or status}: {message}; "
                "check the Mount's credentials Secret"
            )
        if code in _TRANSIENT_CODES or status >= 500:
            return Unavailable(f"store {store} failed {what} of {url}: {code or status}: {message}")
        if code in _NOT_FOUND_CODES or status == 404:
            return NotFound(f"{url} does not exist")
    if isinstance(exc, _TRANSIENT_TYPES):
        return Unavailable(f"store {store} could not be reached at {where()} ({what} of {url}): {exc}")
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"{url} does not exist")
    if isinstance(exc, FileExistsError):
        return AlreadyExists(f"{url} already exists")
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"store {store} denied {what} of {url}: {exc}")
    if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        return InvalidArgument(f"{what} of {url}: {exc.strerror or exc}")
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        return InvalidArgument(f"store {store} refuses {what} of {url}: a name or the path is longer than "
                               f"the store allows ({exc.strerror or exc})")
    if isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY:
        return InvalidArgument(f"{url} is a directory that is not empty; delete it recursively")
    return exc
