"""The store backend for S3 (and stores that speak its API): conditional reads (If-Match),
uploads in one PUT or in parts, server-side copies, and totals from the paginated listing."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import re
import time
from collections.abc import AsyncGenerator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aiobotocore.session import AioSession  # type: ignore[import-untyped]
from botocore.utils import parse_timestamp
from fsspec.spec import AbstractFileSystem
from s3fs.core import calculate_chunksize

from strata.contract.errors import InvalidArgument
from .errors import VersionChanged, s3_error
from .generic import FsspecStore
from .status import TOTALS_DUTY, ListedPage, StoreTotals, UfsStatus, _upload_rel

# Bytes: the largest object S3 copies in one CopyObject call.
_S3_COPY_LIMIT = 5 * 2**30
# Connections to the store one mount keeps (botocore's default is 10): room for the readers'
# own fetches beside a worker's read-ahead (STRATA_WORKER_FOLDER_READAHEAD_FILES, 8), so a
# reader never waits for a connection the read-ahead holds.
STORE_CONNECTIONS = 32

# Statuses a walk holds back at most to give them in path order (`S3Store._walk_pages`): past
# it the first are given (~30 MiB as status objects).
_S3_WALK_HELD = 100_000
# The characters that sort before "/": a name with one of them may have a folder come later
# whose name is the part before it ("a" after "a.txt", "a-b/...").
_BEFORE_SLASH = re.compile("[\x00-\x2e]")


_MONTHS = {name: number for number, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


def s3_timestamp(text: str) -> datetime:
    """A time as S3 writes it, in UTC: an HTTP date in headers ("Sun, 06 Dec 2026 16:02:34
    GMT", a GET's Last-Modified) or ISO 8601 in listings ("2026-12-06T16:02:34.000Z").
    botocore's own parser (dateutil's, ~0.15 ms a time) took a tenth of the worker's CPU of
    a small GET and ~0.15 s of each 1000-entry listing page; these two forms are read
    directly, any other goes to botocore's parser as before."""
    try:
        if text.endswith(" GMT"):
            _, day, month, year, clock, _ = text.split(" ")
            hour, minute, second = clock.split(":")
            return datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second),
                            tzinfo=timezone.utc)
        if text.endswith("Z"):
            return datetime.fromisoformat(text[:-1]).replace(tzinfo=timezone.utc)
    except (ValueError, KeyError):
        pass
    return parse_timestamp(text)  # type: ignore[no-any-return]


def _key_before(key: str) -> str:
    """A string just below `key` in S3's order (by UTF-8 bytes) that no likely key lies
    between: its last character one lower, then U+10FFFF, the highest character (the key
    itself, without its last character, where that cannot be made)."""
    code = ord(key[-1]) - 1
    if 0xD800 <= code <= 0xDFFF:  # surrogates are no characters: the one below them
        code = 0xD7FF
    below = key[:-1] + chr(code) + "\U0010ffff" if code >= 0 else key[:-1]
    return below if len(below.encode("utf-8")) <= 1024 else key[:-1]


class S3Store(FsspecStore):
    """One mount's store on S3 (s3fs), with the calls s3fs does not make as Strata needs them."""


    def _fs_options(self) -> dict[str, Any]:
        kwargs = super()._fs_options()
        # One retry helper: botocore and s3fs make a single try each.
        config = dict(kwargs.get("config_kwargs") or {})
        config["retries"] = {"total_max_attempts": 1}
        config.setdefault("connect_timeout", self._timeouts.connect_timeout)
        config.setdefault("read_timeout", self._timeouts.read_timeout)
        config.setdefault("max_pool_connections", STORE_CONNECTIONS)
        kwargs["config_kwargs"] = config
        return kwargs

    def _make_fs(self) -> AbstractFileSystem:
        fs = super()._make_fs()
        fs.retries = 1
        if fs.session is None:  # the session s3fs would make, with S3's times read by `s3_timestamp`
            fs.session = AioSession(**fs.kwargs)
            fs.session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=s3_timestamp)
        return fs

    async def check(self) -> None:
        """Can the root be listed with these options? Raises NotFound (missing bucket or
        directory), PermissionDenied (refused credentials) or Unavailable (unreachable)."""
        bucket, _, prefix = self._root.partition("/")

        async def list_one() -> None:
            fs = await self._filesystem()
            await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)

        # An empty prefix is a valid (empty) mount; the bucket must exist.
        await self._call("check", "", list_one)

    async def listed_from(self, folder: str, limit: int, start: str = "") -> ListedPage | None:
        """One list_objects_v2 page of `folder` (its files, and its subfolders as S3's common
        prefixes), from `start`'s key on (StartAfter just below it, `_key_before`). Folder
        markers (keys ending in "/") are left out, as `ls` leaves them out."""
        if not 0 < limit <= 1000:
            raise InvalidArgument(f"a listing page holds 1 to 1000 entries, got {limit}")
        bucket, _, key = self._path(folder).partition("/")
        prefix = key.strip("/") + "/" if key.strip("/") else ""
        if start and not start.startswith(folder.strip("/") + "/" if folder.strip("/") else ""):
            raise InvalidArgument(f"a listing of {folder!r} cannot start at {start!r}, which is not in it")
        after = {"StartAfter": _key_before(self._path(start).partition("/")[2])} if start else {}

        async def page() -> Any:
            fs = await self._filesystem()
            return await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, Delimiter="/",
                                     MaxKeys=limit, **after)

        answer = await self._call("list", folder, page)
        found = [self._status({"name": f"{bucket}/{item['Key']}", "type": "file", "size": item.get("Size"),
                               "ETag": item.get("ETag"), "LastModified": item.get("LastModified")})
                 for item in answer.get("Contents", ()) if not str(item["Key"]).endswith("/")]
        found += [self._status({"name": f"{bucket}/{str(item['Prefix']).rstrip('/')}", "type": "directory"})
                  for item in answer.get("CommonPrefixes", ()) if str(item["Prefix"]).strip("/")]
        return ListedPage(sorted(found, key=lambda s: s.path), not answer.get("IsTruncated"))

    async def _walk_pages(self, rel: str, path: str, with_dirs: bool,
                          page: int) -> AsyncGenerator[list[UfsStatus], None]:
        """`walk_pages` on S3: the bucket's listing of the prefix, list_objects_v2 page by
        page (each a bounded "list" call, retried as one), handed over in pages of at most
        `page` statuses. S3 has no folders: with `with_dirs`, a folder is known with the
        first key below it, which may come after names beside it that sort before "/" (a key
        "a.txt" beside the keys "a/..." comes before the folder "a"). So statuses wait in a
        heap until no folder still to come can sort before them: after a key, every folder
        still to come sorts at or after the key's part before its first character below "/"
        (a later key is larger; a folder of it before that part would be a prefix of this
        key, so open already, or sort after it). Names with no such character hold nothing
        back. At most `_S3_WALK_HELD` statuses are held: past it the first are given, and a
        folder that still comes late puts the walk out of order (its taker sorts what it
        kept). Folder markers (keys ending in "/") give their folder, never a file."""
        bucket, prefix = self._bucket_prefix(rel)
        top = rel.strip("/")
        under = f"{top}/" if top else ""
        # The folders of the last key: keys come sorted, so the keys below a folder come
        # together, and a folder left is never met again.
        folders: list[str] = []
        held: list[tuple[str, int, UfsStatus]] = []
        order = itertools.count()  # ties (a file and a folder of one name) in the order they came
        out: list[UfsStatus] = []
        async for answer in self._key_pages(rel):
            for item in answer.get("Contents", ()):
                name = str(item["Key"])[len(prefix):]
                parts = name.strip("/").split("/") if name.strip("/") else []
                below = parts if name.endswith("/") else parts[:-1]
                at = 0
                while at < len(folders) and at < len(below) and folders[at] == below[at]:
                    at += 1
                del folders[at:]
                for part in below[at:]:
                    folders.append(part)
                    if with_dirs:
                        folder = "/".join(filter(None, (top, *folders)))
                        heapq.heappush(held, (folder, next(order), UfsStatus(folder, True, 0, 0, "")))
                if not name.endswith("/"):
                    status = self._status({"name": f"{bucket}/{item['Key']}", "type": "file", "size": item.get("Size"),
                                           "ETag": item.get("ETag"), "LastModified": item.get("LastModified")})
                    heapq.heappush(held, (status.path, next(order), status))
                early = _BEFORE_SLASH.search(name) if with_dirs else None
                bound = None if early is None else under + name[:early.start()]
                while held and (bound is None or held[0][0] < bound or len(held) > _S3_WALK_HELD):
                    out.append(heapq.heappop(held)[2])
                while len(out) >= page:
                    yield out[:page]
                    del out[:page]
        while held:
            out.append(heapq.heappop(held)[2])
        for at in range(0, len(out), page):
            yield out[at:at + page]

    def _bucket_prefix(self, rel: str) -> tuple[str, str]:
        """The bucket, and the prefix of the keys at or below `rel` ("" for the bucket's root)."""
        bucket, _, key = self._path(rel).partition("/")
        return bucket, key.strip("/") + "/" if key.strip("/") else ""

    async def _key_pages(self, rel: str) -> AsyncGenerator[dict[str, Any], None]:
        """The bucket's listing of the keys below `rel`, list_objects_v2 page by page (each
        a bounded "list" call, retried as one)."""
        bucket, prefix = self._bucket_prefix(rel)
        token: str | None = None
        while True:
            more = {"ContinuationToken": token} if token else {}

            async def listed(more: dict[str, str] = more) -> Any:
                fs = await self._filesystem()
                return await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, **more)

            answer = await self._call("list", rel, listed)
            yield answer
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return

    async def totals(self, rel: str = "") -> StoreTotals:
        self._path(rel)
        return await self._total_s3(rel)

    async def _total_s3(self, rel: str) -> StoreTotals:
        """`totals` on S3: the bucket's listing of the prefix, page by page (`_key_pages`),
        paced like the file:// walk."""
        root = self._root.partition("/")[2]
        top = len(root.strip("/") + "/") if root.strip("/") else 0
        files = size = 0
        started = time.monotonic()
        async for answer in self._key_pages(rel):
            for item in answer.get("Contents", ()):
                key = str(item["Key"])
                if not key.endswith("/") and not _upload_rel(key[top:]):
                    files += 1
                    size += int(item.get("Size") or 0)
            if answer.get("IsTruncated"):
                await asyncio.sleep((time.monotonic() - started) * (1 - TOTALS_DUTY) / TOTALS_DUTY)
            started = time.monotonic()
        return StoreTotals(files, size)

    async def _read(self, rel: str, path: str, start: int, end: int, version: str | None) -> bytes:
        if version is not None:
            return await self._read_s3_if_match(path, start, end, version)
        return await super()._read(rel, path, start, end, version)

    async def _read_s3_if_match(self, path: str, start: int, end: int, version: str) -> bytes:
        """One ranged GET that the store answers only if the object's etag is `version`."""
        fs = await self._filesystem()
        bucket, key, version_id = fs.split_path(path)
        extra = {"VersionId": version_id} if version_id else {}
        if end > start:
            extra["Range"] = f"bytes={start}-{end - 1}"
        try:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key, IfMatch=f'"{version}"', **extra)
        except OSError as exc:
            error = s3_error(exc)
            if error is not None and (error[0] == "PreconditionFailed" or error[1] == 412):
                raise VersionChanged(
                    f"{self.url(self._rel(path))} changed in the store: it is no longer version "
                    f"{version!r}, the version the file was opened as; open it again to read the new version"
                ) from exc
            raise
        body = response["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data) if end > start else b""

    async def _upload(self, rel: str, path: str, local_path: Path, length: int) -> UfsStatus:
        return self._written_status(rel, length,
                                    await self._call("upload", rel, lambda: self._put_s3(path, local_path)))

    async def copy(self, src: str, dst: str) -> UfsStatus:
        src_path, dst_path = self._path(src), self._path(dst)
        source = await self.info(src)
        if source.length <= _S3_COPY_LIMIT:
            return self._written_status(dst, source.length,
                                        await self._call("copy", src, lambda: self._copy_s3(src_path, dst_path)))
        return await super().copy(src, dst)

    async def _put_s3(self, path: str, local_path: Path) -> str:
        """Upload a local file: one PUT, or a multipart upload in s3fs's part size when
        large; the ETag of the object made."""
        fs = await self._filesystem()
        bucket, key, _ = fs.split_path(path)
        size = local_path.stat().st_size
        part = calculate_chunksize(size)
        with open(local_path, "rb") as f:
            if size < 2 * part:
                answer = await fs._call_s3("put_object", Bucket=bucket, Key=key, Body=await asyncio.to_thread(f.read))
            else:
                upload = await fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key)
                try:
                    parts = await fs._upload_file_part_concurrent(bucket, key, upload, f, part)
                    answer = await fs._call_s3(
                        "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                        MultipartUpload={"Parts": [{"PartNumber": i, "ETag": p["ETag"]} for i, p in enumerate(parts, 1)]},
                    )
                except BaseException:
                    with contextlib.suppress(Exception):  # parts left behind are never listed
                        await asyncio.shield(fs._abort_mpu(bucket, key, upload["UploadId"]))
                    raise
        fs.invalidate_cache(path)
        return str(answer["ETag"]).strip('"')

    async def _copy_s3(self, src_path: str, dst_path: str) -> str:
        """A server-side copy of an object of at most 5 GiB; the ETag of the copy."""
        fs = await self._filesystem()
        src_bucket, src_key, _ = fs.split_path(src_path)
        bucket, key, _ = fs.split_path(dst_path)
        answer = await fs._call_s3("copy_object", Bucket=bucket, Key=key,
                                   CopySource={"Bucket": src_bucket, "Key": src_key})
        fs.invalidate_cache(dst_path)
        return str(answer["CopyObjectResult"]["ETag"]).strip('"')

    async def close(self) -> None:
        await super().close()
        fs = self._fs
        creator = getattr(fs, "_s3creator", None)
        if creator is not None and self._fs_loop is asyncio.get_running_loop():
            try:
                await creator.__aexit__(None, None, None)
            finally:
                fs._s3creator = None
                fs._s3 = None
