"""The operator's masters: one client (strata.contract.master's MasterClient: token,
deadlines, status codes to errors, Unreachable when a master is away) per master and token,
and one Report per master shared among the Mounts of a cluster for a short while.
Calls raise the server's details alone; the operator's messages say which master.
"""

from __future__ import annotations

import asyncio

from cachetools import TTLCache

from strata.contract.master import MasterClient
from strata.contract.proto import strata_pb2 as pb

# Masters whose Reports are kept at once (one per CacheCluster's master and token).
REPORTS_KEPT = 1024


class Masters:
    """Clients by (endpoint, token), and each master's Report reused for `report_ttl` seconds."""

    def __init__(self, *, timeout: float, report_ttl: float) -> None:
        self._timeout = timeout
        self._clients: dict[tuple[str, str], MasterClient] = {}
        self._reports: TTLCache[tuple[str, str], pb.ReportResponse] = TTLCache(REPORTS_KEPT, report_ttl)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def client(self, endpoint: str, token: str) -> MasterClient:
        key = (endpoint, token)
        if key not in self._clients:
            self._clients[key] = MasterClient(endpoint, token, timeout=self._timeout)
        return self._clients[key]

    async def report(self, endpoint: str, token: str, *, fresh: bool = False) -> pb.ReportResponse:
        """The master's Report, from the cache unless older than the TTL or `fresh`."""
        key = (endpoint, token)
        async with self._locks.setdefault(key, asyncio.Lock()):
            cached = self._reports.get(key)
            if cached is not None and not fresh:
                return cached
            report = await self.client(endpoint, token).report()
            self._reports[key] = report
            return report

    def invalidate(self, endpoint: str) -> None:
        """Forget cached Reports of a master (after a change such as a mount)."""
        for key in [k for k in self._reports if k[0] == endpoint]:
            del self._reports[key]

    async def forget(self, endpoint: str) -> None:
        """Close the channels to a master that is gone (its cluster was deleted)."""
        self.invalidate(endpoint)
        for key in [k for k in self._clients if k[0] == endpoint]:
            await self._clients.pop(key).close()

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        self._reports.clear()
        for client in clients.values():
            await client.close()
