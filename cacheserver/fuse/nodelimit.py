"""The bound of a FUSE mount's node table (`strata fuse --max-nodes`): when the kernel holds more
nodes than that, it is asked to drop the entries of the least recently looked-up ones.

The kernel keeps an entry, and the node under it, until memory pressure shrinks its cache;
this process keeps a node (its path, lookup count, pin and the status it was told) for as
long as the kernel does. Past the bound, a thread of its own sends FUSE_NOTIFY_INVAL_ENTRY for
each chosen node (its parent's node and its name): the kernel unhashes the entry, drops the
node once nothing uses it (a file held open keeps it until closed) and sends FORGET, which
frees it here as any forget does (see nodes.py). A name looked up again afterwards gets a new
node. Never a request handler's thread: the kernel takes the parent folder's lock for the
notification, which a lookup in that folder holds while it waits for its answer.
"""

from __future__ import annotations

import errno
import logging
import os
import threading

from . import wire
from .nodes import NodeTable

log = logging.getLogger("strata.fuse")


class NodeLimit:
    """Keeps `nodes` near its limit on the connection `fd` (see the module docstring)."""

    def __init__(self, fd: int, nodes: NodeTable) -> None:
        self.fd = fd
        self.nodes = nodes
        self.limit = nodes.limit
        # Nodes asked for beyond the bound at once, so that a stream of new lookups is
        # answered by a notification per node in batches, not by a wake-up per lookup.
        self.slack = max(1, (self.limit or 0) // 20)
        self._wake = threading.Event()
        nodes.when_over_limit(self._wake.set)

    def start(self) -> None:
        if self.limit is not None:
            threading.Thread(target=self._run, name="strata-fuse-node-limit", daemon=True).start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if not self.drop_excess():
                return

    def drop_excess(self) -> bool:
        """Ask the kernel to drop the entries of the nodes past the bound; False once the
        connection is gone."""
        for nodeid, path in self.nodes.over_limit(self.slack):
            head, _, name = path.rpartition("/")
            parent = self.nodes.node_id(head or "/")
            if parent is None or not name:
                continue  # its folder is not held (renamed away meanwhile): nothing to name it by
            try:
                os.write(self.fd, wire.inval_entry_notification(parent, name))
            except OSError as exc:
                if exc.errno == errno.ENODEV:
                    return False  # unmounted
                # ENOENT: the kernel holds no entry of that name (it dropped it, and its FORGET
                # is on the way, or an open file keeps the node after the entry went).
                if exc.errno != errno.ENOENT:
                    log.warning("strata fuse: the kernel could not drop its entry of %s (node %d): %s",
                                path, nodeid, exc)
        return True
