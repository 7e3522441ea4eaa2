"""Requests a gRPC server answered, by method and status code, and how long they took: a
server interceptor that is also the Prometheus collector of what it counted. Labels are
bounded: methods the server has a handler for, and gRPC's status codes."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .timings import Timings

# Seconds: metadata answers take milliseconds; a Load streams for as long as it loads.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)


class RequestMetrics(grpc.aio.ServerInterceptor, Collector):  # type: ignore[misc]
    """Counts and times every call of a server's methods (`<prefix>_requests_total` by
    method and code, `<prefix>_request_seconds` by method)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._timings = Timings(BUCKETS)

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        with self._lock:
            key = (method, code.name)
            self._counts[key] = self._counts.get(key, 0) + 1
        self._timings.observe((method,), seconds)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = str(handler_call_details.method).rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def timed_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = time.monotonic()
                try:
                    answer = await unary(request, context)
                except BaseException:
                    self.observe(method, _code(context, failed=True), time.monotonic() - started)
                    raise
                self.observe(method, _code(context, failed=False), time.monotonic() - started)
                return answer

            return grpc.unary_unary_rpc_method_handler(
                timed_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            stream = handler.unary_stream

            async def timed_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                started = time.monotonic()
                try:
                    async for item in stream(request, context):
                        yield item
                except BaseException:
                    self.observe(method, _code(context, failed=True), time.monotonic() - started)
                    raise
                self.observe(method, _code(context, failed=False), time.monotonic() - started)

            return grpc.unary_stream_rpc_method_handler(
                timed_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler  # client-streaming calls are not timed

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        with self._lock:
            counts = dict(self._counts)
        requests = CounterMetricFamily(f"{self._prefix}_requests", "gRPC requests answered, by method and status code",
                                       labels=["method", "code"])
        for (method, code), count in sorted(counts.items()):
            requests.add_metric([method, code], count)
        yield requests
        yield self._timings.family(f"{self._prefix}_request_seconds", "How long gRPC requests took, by method",
                                   ["method"])


def _code(context: grpc.aio.ServicerContext, *, failed: bool) -> grpc.StatusCode:
    """The status the call ends with: the one its handler set, else OK, or UNKNOWN for an
    exception that set none."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK
