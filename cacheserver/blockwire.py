"""The block transfer protocol of the worker's data port (TCP) and its short-circuit socket
(Unix): a JSON line per request and per reply.

  request  {"token": "...", "block": {mount_id, path, version, index, block_size,
            file_length, in_store}, "read_type": 1, "offset": 0, "length": 0, "readahead": 2}
  reply    {"ok": true, "length": N, "hit": true}
  or       {"ok": false, "code": "NOT_FOUND", "message": "..."}

What follows an ok reply depends on the socket: on the data port, exactly N bytes of the block
from `offset`; on the short-circuit socket, the block file's descriptor (SCM_RIGHTS), and N
is the whole block's length. `offset`, `length` and `readahead` matter on the data port only.
`code` is a gRPC status name, as the same error would carry over gRPC.

On the short-circuit socket the reply also carries `checksums` (CRC-32C of each `chunk_size`
piece of the block file) and the reader verifies every chunk it reads; a reader that finds
a bad one sends the request again with `"verify": 1`, and the worker checks the whole block
before it answers (a damaged copy is dropped and fetched again from the store).
A request's block names version, block size and file length; a cached block is served under
that name, but a miss is fetched only when the namespace agrees (see worker/geometry.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from strata.contract.errors import StrataError
from strata.contract.proto import strata_pb2 as pb

# A request line longer than this is refused (a block request is a few hundred bytes).
MAX_REQUEST_BYTES = 64 * 1024

_BLOCK_FIELDS = ("mount_id", "path", "version", "index", "block_size", "file_length", "in_store")
_ERRORS_BY_CODE = {cls.code.name: cls for cls in StrataError.__subclasses__()}


def request_line(token: str, ref: pb.BlockRef, read_type: int, **extra: int) -> bytes:
    block = {name: getattr(ref, name) for name in _BLOCK_FIELDS}
    return (json.dumps({"token": token, "block": block, "read_type": read_type, **extra}) + "\n").encode()


def parse_request(line: bytes) -> tuple[dict[str, Any], pb.BlockRef]:
    """The request and its block; ValueError, KeyError or TypeError when malformed."""
    request = json.loads(line)
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    return request, pb.BlockRef(**request["block"])


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
