"""Which sources a store can be made of, and the options it is made with. How long its calls
may take is the servers' setting `StoreTimeouts` (cacheserver/settings.py)."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.core import split_protocol
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations
from fsspec.spec import AbstractFileSystem
from s3fs import S3FileSystem

from strata.contract.constants import FSSPEC_PROTOCOL
from strata.contract.errors import InvalidArgument
from strata.contract.urls import shown_url

# Storage options that Strata sets itself; a Mount cannot override them.
_MANAGED_OPTIONS = frozenset({"asynchronous", "loop", "skip_instance_cache", "use_listings_cache"})
# Schemes whose filesystem wraps another one or reads files of the server's host (caches,
# archives, directory views, references, git checkouts): a Mount could reach any host file
# through their options, so they are not mountable. file:// is, under allowed roots only.
_HOST_READING_PROTOCOLS = frozenset({
    "async_wrapper", "asyncwrapper", "asynclocal", "blockcache", "cached", "dask", "dir", "filecache",
    "generic", "git", "libarchive", "reference", "simplecache", "tar", "zip",
})
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def supported_protocols() -> list[str]:
    """URL schemes this server can mount: fsspec protocols whose package is installed."""
    found = set(fsspec.registry)  # already imported implementations
    for protocol, spec in known_implementations.items():
        module = spec["class"].split(".", 1)[0]
        if importlib.util.find_spec(module) is not None:
            found.add(protocol)
    found.discard(FSSPEC_PROTOCOL)  # Strata inside Strata would loop
    return sorted(found)


def filesystem_class(source: str) -> tuple[str, type[AbstractFileSystem]]:
    """The scheme of `source` and the fsspec class that serves it; InvalidArgument if
    `source` is not a URL this server can mount."""
    if "::" in source:
        raise InvalidArgument(
            f"source {shown_url(source)!r} chains filesystems; give a plain URL such as s3://bucket/prefix"
        )
    protocol, _ = split_protocol(source)
    if not protocol:
        raise InvalidArgument(
            f"source {shown_url(source)!r} has no scheme; write a URL such as s3://bucket/prefix, "
            "file:///abs/dir or memory://name"
        )
    protocol = protocol.lower()
    if protocol == FSSPEC_PROTOCOL:
        raise InvalidArgument(f"source {shown_url(source)!r}: a Strata path cannot be mounted into Strata")
    try:
        cls: type[AbstractFileSystem] = fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise InvalidArgument(
            f"unknown store scheme {protocol!r} in source {shown_url(source)!r}; supported here: "
            + ", ".join(supported_protocols())
        ) from None
    except ImportError as exc:
        raise InvalidArgument(
            f"store scheme {protocol!r} (source {shown_url(source)!r}) needs a package this server "
            f"does not have: {exc}; use an image that includes it"
        ) from None
    if protocol in _HOST_READING_PROTOCOLS:
        raise InvalidArgument(
            f"store scheme {protocol!r} (source {shown_url(source)!r}) wraps another filesystem or reads the "
            "server host's files; mount the store itself (s3://..., or file:// under an allowed root)"
        )
    return protocol, cls


def is_local(cls: type[AbstractFileSystem]) -> bool:
    """Does this filesystem read the server host's own files (file://)?"""
    return issubclass(cls, LocalFileSystem)


def _shown_value(value: str, secret: bool) -> str:
    """How a message shows an option's value: never, if it came from the credentials."""
    return "got a value from the Mount's credentials (not shown)" if secret else f"got {value!r}"


def _to_bool(name: str, value: str, secret: bool) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidArgument(f"store option {name}: expected true or false, {_shown_value(value, secret)}")


def _to_number(name: str, value: str, kind: type[int] | type[float], secret: bool) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(f"store option {name}: expected a number, {_shown_value(value, secret)}") from None


def storage_options(cls: type[AbstractFileSystem], options: Mapping[str, Any],
                    secret: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Turn string options (as YAML gives them) into the keyword arguments `cls` takes:
    "true"/"false" and numbers become bool/int/float where the parameter's default has that
    type. For S3, `region` goes to the client; options s3fs does not know are refused. The
    values of the options named in `secret` (the credentials) are never put in a message."""
    params = inspect.signature(cls.__init__).parameters
    is_s3 = issubclass(cls, S3FileSystem)
    out: dict[str, Any] = {}
    client_kwargs: dict[str, Any] = {}
    for name, value in options.items():
        if name in _MANAGED_OPTIONS:
            raise InvalidArgument(f"store option {name} is managed by Strata; remove it from the Mount")
        if is_s3 and name in ("region", "region_name"):
            client_kwargs["region_name"] = value
            continue
        param = params.get(name)
        if param is None and is_s3:
            accepted = sorted(p for p in params if p not in ("self", "kwargs", "args") and p not in _MANAGED_OPTIONS)
            raise InvalidArgument(
                f"store option {name!r} is not an S3 option; use one of: region, " + ", ".join(accepted)
            )
        default = param.default if param is not None else None
        if isinstance(value, str):
            if isinstance(default, bool):
                value = _to_bool(name, value, name in secret)
            elif isinstance(default, (int, float)):
                value = _to_number(name, value, type(default), name in secret)
        out[name] = value
    if client_kwargs:
        out["client_kwargs"] = {**(out.get("client_kwargs") or {}), **client_kwargs}
    return out
