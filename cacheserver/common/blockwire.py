"""The block transfer protocol of the worker's data port (TCP) and its short-circuit socket
(Unix): a JSON line per request and per reply.

  request  {"token": "...", "block": {mount_id, path, version, index, block_size,
            file_length, in_store}, "read_type": 1, "offset": 0, "length": 0, "readahead": 2,
            "client": "fuse"}
  reply    {"ok": true, "length": N, "hit": true}
  or       {"ok": false, "code": "NOT_FOUND", "message": "..."}

A reader that does not know a file's status yet opens it by path instead (one round trip for
status and bytes, see worker/kept.py):

  request  {"token": "...", "open": "/path", "read_type": 1, "whole_below": 1048576, "fetch": 1,
            "client": "fuse"}
  reply    {"ok": true, "file": "<FileInfo, serialized, base64>", "block": true, "length": N, ...}

A reader that stats a file it holds no status of asks for its folder's statuses at once
(see worker/folders.py):

  request  {"token": "...", "list": "/folder", "client": "fsspec"}
  reply    {"ok": true, "listing": "<ListStatusResponse, serialized, base64>", "age_ms": 120}
  or       {"ok": true, "reusable": false}  (the master marks the folder's answers not reusable)
  or       {"ok": true, "too_large": true}  (a folder of more entries than a listing carries)

`age_ms` is how long before the reply the worker asked the master: each entry stands for its
valid_for_ms from that moment. Nothing follows these replies.

`file` is the file's status as the master gave it, its valid_for_ms what is left of the time
the master would answer the same. When `block` is true the reply is a block's ok reply for
the file's only block (the whole file: it has fewer than `whole_below` bytes), followed by
what follows one; the worker includes it when it holds the block, or when `fetch` says to
fetch it from the store on a miss. Otherwise nothing follows.

What follows an ok reply depends on the socket: on the data port, exactly N bytes of the block
from `offset`; on the short-circuit socket, the block file's descriptor (SCM_RIGHTS), and N
is the whole block's length. `offset`, `length` and `readahead` matter on the data port only
(`readahead` as gRPC's readahead_blocks: at most MAX_READAHEAD_BLOCKS, more is cut to that).
`code` is a gRPC status name, as the same error would carry over gRPC. `client` says what
kind of reader asks (`CLIENT_KINDS`; ReadBlockRequest.client over gRPC): the worker counts the
bytes it serves by it, and any other value (or none) as `other` (`client_label`).

Every ok reply also carries `checksums` and `chunk_size`. On the data port they are the
CRC-32C of each `chunk_size` piece of the N bytes that follow (the last piece may be
shorter), and the reader checks them all before it hands the bytes on: a copy damaged on the
way is read again, never returned. On the short-circuit socket they are those of the block
file's chunks, and the reader verifies every chunk it reads; a reader that finds a bad one
sends the request again with `"verify": 1`, and the worker checks the whole block before it
answers (a damaged copy is dropped and fetched again from the store).

The worker's gRPC calls carry checksums the same way: ReadBlock's first
message has those of the bytes the whole answer carries, and every WriteFile or AppendFile
message the CRC-32C of its own bytes (`write_chunk`), checked before anything is written.
A request's block names version, block size and file length; a cached block is served under
that name, but a miss is fetched only when the namespace agrees (see worker/geometry.py).
"""

from __future__ import annotations

import base64
import json
import logging
import mmap
from collections.abc import Sequence
from typing import Any

from crc32c import crc32c
from google.protobuf.message import DecodeError

from strata.contract.errors import DataLoss, InvalidArgument, StrataError, Unavailable
from strata.contract.proto import strata_pb2 as pb
from .checksums import first_bad_chunk

log = logging.getLogger(__name__)

# A request line longer than this is refused (a block request is a few hundred bytes).
MAX_REQUEST_BYTES = 64 * 1024

# The kinds of reader a worker counts served bytes by; anything else is counted as "other",
# so the metric's labels stay these few whatever a request says.
CLIENT_KINDS = ("fsspec", "fuse")
OTHER_CLIENT = "other"

_BLOCK_FIELDS = ("mount_id", "path", "version", "index", "block_size", "file_length", "in_store")
_ERRORS_BY_CODE = {cls.code.name: cls for cls in StrataError.__subclasses__()}


def client_label(kind: object) -> str:
    """The label a request's `client` is counted under: one of CLIENT_KINDS, else "other"."""
    return kind if isinstance(kind, str) and kind in CLIENT_KINDS else OTHER_CLIENT


def request_line(token: str, ref: pb.BlockRef, read_type: int, *, client: str = "", **extra: int) -> bytes:
    block = {name: getattr(ref, name) for name in _BLOCK_FIELDS}
    request = {"token": token, "block": block, "read_type": read_type, **extra}
    if client:
        request["client"] = client
    return (json.dumps(request) + "\n").encode()


def open_line(token: str, path: str, read_type: int, *, whole_below: int, fetch: bool, client: str = "") -> bytes:
    """A request for the status of the file at `path` and, if small, its bytes."""
    request = {"token": token, "open": path, "read_type": read_type, "whole_below": whole_below, "fetch": int(fetch)}
    if client:
        request["client"] = client
    return (json.dumps(request) + "\n").encode()


def list_line(token: str, path: str, *, client: str = "") -> bytes:
    """A request for the statuses of the entries of the folder at `path`."""
    request = {"token": token, "list": path}
    if client:
        request["client"] = client
    return (json.dumps(request) + "\n").encode()


def table_line(token: str, *, client: str = "") -> bytes:
    """A request for the descriptor of the node's status table (`statustable`)."""
    request: dict[str, Any] = {"token": token, "table": 1}
    if client:
        request["client"] = client
    return (json.dumps(request) + "\n").encode()


def listing_reply(files: bytes | None, age: float, *, too_large: bool = False) -> dict[str, Any]:
    """A folder's reply: its serialized ListStatusResponse (`files`) asked `age` seconds ago;
    None: its answers are not reusable, or (`too_large`) it has too many entries."""
    if files is None:
        return {"ok": True, "too_large": True} if too_large else {"ok": True, "reusable": False}
    return {"ok": True, "listing": base64.b64encode(files).decode(), "age_ms": int(age * 1000)}


def listing_of(reply: dict[str, Any]) -> tuple[list[pb.FileInfo], float] | bool:
    """The entries a folder's reply carries and their age (seconds); False when the folder's
    answers are not reusable, True when it is too large to list. ValueError if malformed."""
    if "listing" not in reply:
        return bool(reply.get("too_large"))
    try:
        listing = pb.ListStatusResponse.FromString(base64.b64decode(reply["listing"], validate=True))
        return list(listing.files), max(0, int(reply.get("age_ms", 0))) / 1000
    except (TypeError, ValueError, DecodeError) as exc:
        raise ValueError(f"a folder's reply without a readable listing: {exc}") from exc


def parse_line(line: bytes) -> dict[str, Any]:
    """The request of a line; ValueError when it is not a JSON object."""
    request = json.loads(line)
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    return request


def block_of(request: dict[str, Any]) -> pb.BlockRef:
    """The block a request names; KeyError or TypeError when malformed."""
    return pb.BlockRef(**request["block"])


def parse_request(line: bytes) -> tuple[dict[str, Any], pb.BlockRef]:
    """The request and its block; ValueError, KeyError or TypeError when malformed."""
    request = parse_line(line)
    return request, block_of(request)


def with_file(reply: dict[str, Any], info: pb.FileInfo, *, block: bool) -> dict[str, Any]:
    """An open's reply: `reply` (a block's ok reply, or a bare ok) with the file's status."""
    return {**reply, "file": base64.b64encode(info.SerializeToString()).decode(), "block": block}


def file_of(reply: dict[str, Any]) -> pb.FileInfo:
    """The status an open's reply carries; ValueError if it carries none that parses."""
    try:
        return pb.FileInfo.FromString(base64.b64decode(reply["file"], validate=True))
    except (KeyError, TypeError, ValueError, DecodeError) as exc:
        raise ValueError(f"an open's reply without a readable file status: {exc}") from exc


def reply_line(reply: dict[str, Any]) -> bytes:
    return (json.dumps(reply) + "\n").encode()


def ok_reply(length: int, hit: bool, *, checksums: Sequence[int] = (), chunk_size: int = 0) -> dict[str, Any]:
    reply: dict[str, Any] = {"ok": True, "length": length, "hit": hit}
    if chunk_size:
        reply.update(checksums=list(checksums), chunk_size=chunk_size)
    return reply


def error_reply(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": message}


def check_reply(line: bytes) -> dict[str, Any]:
    """An ok reply, or the StrataError an error reply stands for."""
    reply = json.loads(line)
    if not reply.get("ok"):
        cls = _ERRORS_BY_CODE.get(reply.get("code", ""), StrataError)
        raise cls(reply.get("message", "block request refused"))
    return reply  # type: ignore[no-any-return]


# -- checksums of bytes in transit ------------------------------------------------------------

class DamagedInTransit(Unavailable):
    """Bytes from a worker failed their CRC-32C check on the way: they are never returned;
    the reader asks again (over another transport, or another worker)."""


def check_pieces(data: bytes | memoryview | mmap.mmap, checksums: Sequence[int], chunk_size: int, what: str) -> None:
    """DamagedInTransit (logged as a warning) unless every `chunk_size` piece of received
    `data` has its CRC-32C in `checksums`; `what` names the transfer in the message."""
    if not len(data) and not checksums:
        return
    pieces = -(-len(data) // chunk_size) if chunk_size > 0 else -1
    if pieces != len(checksums):
        problem = f"{len(checksums)} checksums came with {len(data)} bytes (pieces of {chunk_size})"
    else:
        bad = first_bad_chunk(data, 0, checksums, chunk_size)
        if bad is None:
            return
        problem = (f"bytes {bad * chunk_size}-{min((bad + 1) * chunk_size, len(data)) - 1} "
                   "failed their CRC-32C check in transit")
    message = f"{what}: {problem}; the bytes are not used"
    log.warning("%s", message)
    raise DamagedInTransit(message)


def joined_block(chunks: Sequence[pb.ReadBlockChunk], what: str) -> bytes:
    """The bytes of a ReadBlock answer, checked against the checksums its first message
    carries (DamagedInTransit otherwise)."""
    if not chunks:
        raise DamagedInTransit(f"{what}: the answer had no message")
    data = chunks[0].data if len(chunks) == 1 else b"".join(c.data for c in chunks)
    check_pieces(data, chunks[0].checksums, chunks[0].checksum_chunk_size, what)
    return data


def write_chunk(data: bytes, **first: Any) -> pb.WriteFileChunk:
    """One message of a WriteFile or AppendFile stream, with its bytes' CRC-32C (`first`:
    the fields only the first message has)."""
    return pb.WriteFileChunk(data=data, crc32c=crc32c(data), **first)


def check_write_chunk(chunk: pb.WriteFileChunk, index: int, call: str) -> None:
    """InvalidArgument for a message without its CRC-32C, DataLoss for one whose bytes do not
    match it (message `index` of a `call` stream)."""
    if not chunk.HasField("crc32c"):
        raise InvalidArgument(f"{call}: message {index} carries no crc32c of its bytes; nothing was written")
    if crc32c(chunk.data) != chunk.crc32c:
        raise DataLoss(f"{call}: the {len(chunk.data)} bytes of message {index} failed their CRC-32C check "
                       "in transit; nothing was written")
