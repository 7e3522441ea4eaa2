"""The commands that manage mounts and the cache, through the shared master client, against a
tiny master servicer on 127.0.0.1: what they ask, with the token, and what they print."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from strata.cacheserver import cli
from strata.contract.proto import strata_pb2 as pb
from strata.contract.proto import strata_pb2_grpc as pb_grpc

TOKEN = "cli-admin-token"


class TinyMaster(pb_grpc.MasterServicer):  # type: ignore[misc]
    """Records each call (method, request, token) and answers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str | None]] = []

    def _take(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        self.calls.append((method, request, dict(context.invocation_metadata()).get("authorization")))

    def Mount(self, request: pb.MountRequest, context: grpc.ServicerContext) -> pb.MountResponse:  # noqa: N802
        self._take("Mount", request, context)
        return pb.MountResponse(mount=pb.MountInfo(path=request.path, source=request.source), changed=True)

    def Unmount(self, request: pb.UnmountRequest, context: grpc.ServicerContext) -> pb.UnmountResponse:  # noqa: N802
        self._take("Unmount", request, context)
        return pb.UnmountResponse()

    def ListMounts(self, request: pb.ListMountsRequest, context: grpc.ServicerContext) -> pb.ListMountsResponse:  # noqa: N802
        self._take("ListMounts", request, context)
        return pb.ListMountsResponse(mounts=[pb.MountInfo(path="/logs", source="file:///tmp/logs",
                                                          options=pb.MountOptions(read_only=True))])

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:  # noqa: N802
        self._take("Report", request, context)
        return pb.ReportResponse(capacity=2**30, used=2**20, hits=3, misses=1)

    def Free(self, request: pb.FreeRequest, context: grpc.ServicerContext) -> pb.FreeResponse:  # noqa: N802
        self._take("Free", request, context)
        return pb.FreeResponse(bytes_freed=2**20)

    def SetPinned(self, request: pb.SetPinnedRequest, context: grpc.ServicerContext) -> pb.SetPinnedResponse:  # noqa: N802
        self._take("SetPinned", request, context)
        return pb.SetPinnedResponse()

    def Load(self, request: pb.LoadRequest, context: grpc.ServicerContext) -> Iterator[pb.LoadProgress]:  # noqa: N802
        self._take("Load", request, context)
        for loaded in (0, 1, 2):
            yield pb.LoadProgress(path=request.path, bytes_loaded=loaded * 1024, bytes_total=2048,
                                  files_loaded=loaded, files_total=2)


@pytest.fixture
def master() -> Iterator[tuple[TinyMaster, str]]:
    servicer = TinyMaster()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def run(address: str, *args: str) -> int:
    return cli.main(["--master", address, "--token", TOKEN, *args])


def test_mount_and_cache_commands_ask_the_master_with_the_token(master: tuple[TinyMaster, str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    servicer, address = master
    assert run(address, "mount", "add", "/logs", "file:///tmp/logs", "--option", "a=b", "--read-only") == 0
    assert run(address, "mount", "ls") == 0
    assert run(address, "mount", "rm", "/logs", "--keep-cache") == 0
    assert run(address, "fs", "free", "/logs") == 0
    assert run(address, "fs", "pin", "/logs") == 0
    assert run(address, "fs", "unpin", "/logs") == 0
    assert run(address, "fs", "load", "-q", "/logs", "--bandwidth", "50Mi", "--refresh") == 0
    assert run(address, "report") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "mounted /logs -> file:///tmp/logs"
    assert out[1].split() == ["PATH", "SOURCE", "MODE"] and out[2].split() == ["/logs", "file:///tmp/logs", "ro"]
    assert out[3:8] == ["unmounted /logs", "freed 1MiB", "pinned /logs", "unpinned /logs", "loaded 2/2 files, 2KiB"]
    assert out[8].startswith("capacity 1GiB  used 1MiB  hit ratio 75.00% (3 hits, 1 misses)")
    assert [m for m, _, _ in servicer.calls] == ["Mount", "ListMounts", "Unmount", "Free", "SetPinned", "SetPinned",
                                                 "Load", "Report"]
    assert {token for _, _, token in servicer.calls} == {f"Bearer {TOKEN}"}
    mount, unmount = servicer.calls[0][1], servicer.calls[2][1]
    assert mount.check and not mount.replace and mount.options.read_only and dict(mount.options.options) == {"a": "b"}
    assert not unmount.free
    assert [r.pinned for m, r, _ in servicer.calls if m == "SetPinned"] == [True, False]
    (load,) = [r for m, r, _ in servicer.calls if m == "Load"]
    assert load.path == "/logs" and load.bandwidth == 50 << 20 and load.refresh


def test_an_absent_master_is_one_line_naming_the_call_and_the_master(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("127.0.0.1:1", "mount", "rm", "/logs") == 1
    err = capsys.readouterr().err
    assert err.startswith("strata: unmount /logs (master 127.0.0.1:1): ") and "Traceback" not in err


def test_a_malformed_credential_is_refused_without_showing_it(master: tuple[TinyMaster, str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # A secret given without its KEY= (a slip at the prompt) must not be printed back, into a
    # terminal's scrollback or a CI log.
    servicer, address = master
    assert run(address, "mount", "add", "/d", "s3://bucket/d", "--credential", "AKIA-very-secret") == 1
    err = capsys.readouterr().err
    assert "--credential" in err and "KEY=VALUE" in err
    assert "very-secret" not in err
    assert servicer.calls == []
