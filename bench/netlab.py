"""The slow link to the store: a network namespace reached over a veth pair whose two ends
are shaped with `tc ... tbf` (bandwidth cap in both directions).

    with Link(LinkSettings(rate_mbit=1000)) as link:
        link.exec_prefix      # ["ip", "netns", "exec", NAME] or [] in the loopback fallback
        link.remote_address   # the address the store listens on (inside the namespace)

Everything this module makes carries the name prefix `sbench` (not `strata-`: the e2e
harness deletes namespaces with that prefix) and is removed on exit, also after Ctrl-C or a
failed setup. Where a namespace cannot be made (no root, no `ip`), `Link.fallback` is set and
the store is reached on loopback with no bandwidth cap here (the delaying proxy caps it).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

NETNS = "sbench-s3"
HOST_IF = "sbench-h"  # the end in the root namespace
NS_IF = "sbench-n"    # the end in the store's namespace
# A private /30 nothing else on this machine uses (the e2e cluster takes 10.250/16, 10.97/16).
HOST_ADDRESS = "10.213.7.1"
NS_ADDRESS = "10.213.7.2"
PREFIX_LEN = 30


class LinkError(RuntimeError):
    """A namespace, link or qdisc could not be made."""


@dataclass(frozen=True)
class LinkSettings:
    rate_mbit: float = 1000.0  # bandwidth cap in each direction, Mbit/s
    allow_fallback: bool = True


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LinkError(f"`{' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def tbf_args(device: str, rate_mbit: float) -> list[str]:
    """A tbf qdisc that caps `device` at `rate_mbit`: the bucket holds 10 ms of traffic (at
    least 64 KiB) so a 250 Hz kernel timer can keep the rate, and the queue holds 50 ms."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(int(rate_bytes / 100), 64 * 1024)
    return ["tc", "qdisc", "replace", "dev", device, "root", "tbf",
            "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


def remove_leftovers() -> None:
    """Delete what an earlier, killed run left behind (idempotent)."""
    if (Path("/run/netns") / NETNS).exists():
        _run(["ip", "netns", "del", NETNS], check=False)
    _run(["ip", "link", "del", HOST_IF], check=False)


class Link:
    def __init__(self, settings: LinkSettings) -> None:
        self.settings = settings
        self.fallback = False
        self.fallback_reason = ""
        self._made = False

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the store's namespace."""
        return [] if self.fallback else ["ip", "netns", "exec", NETNS]

    @property
    def remote_address(self) -> str:
        return "127.0.0.1" if self.fallback else NS_ADDRESS

    def describe(self) -> dict[str, object]:
        if self.fallback:
            return {"mode": "loopback-fallback", "reason": self.fallback_reason,
                    "rate_mbit": self.settings.rate_mbit, "shaped_by": "delaying proxy (userspace token bucket)"}
        return {"mode": "netns", "namespace": NETNS, "veth": [HOST_IF, NS_IF],
                "addresses": [f"{HOST_ADDRESS}/{PREFIX_LEN}", f"{NS_ADDRESS}/{PREFIX_LEN}"],
                "rate_mbit": self.settings.rate_mbit, "shaped_by": "tc tbf on both veth ends"}

    def __enter__(self) -> Link:
        try:
            self._make()
        except (LinkError, FileNotFoundError, PermissionError) as exc:
            self.close()
            if not self.settings.allow_fallback:
                raise
            self.fallback = True
            self.fallback_reason = str(exc)
        return self

    def _make(self) -> None:
        remove_leftovers()
        self._made = True
        _run(["ip", "netns", "add", NETNS])
        _run(["ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF, "netns", NETNS])
        _run(["ip", "addr", "add", f"{HOST_ADDRESS}/{PREFIX_LEN}", "dev", HOST_IF])
        _run(["ip", "link", "set", HOST_IF, "up"])
        _run(["ip", "-n", NETNS, "addr", "add", f"{NS_ADDRESS}/{PREFIX_LEN}", "dev", NS_IF])
        _run(["ip", "-n", NETNS, "link", "set", NS_IF, "up"])
        _run(["ip", "-n", NETNS, "link", "set", "lo", "up"])
        _run(tbf_args(HOST_IF, self.settings.rate_mbit))
        _run(["ip", "netns", "exec", NETNS, *tbf_args(NS_IF, self.settings.rate_mbit)])

    def close(self) -> None:
        """Remove the namespace and the veth pair (the qdiscs go with them)."""
        if self._made:
            remove_leftovers()
            self._made = False

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
