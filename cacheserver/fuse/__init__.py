"""FUSE: the Strata namespace as POSIX files (`strata fuse MOUNTPOINT`).

daemon.py runs a mount; kernel.py mounts and ends connections; session.py reads the kernel's
requests and handlers.py answers them (wire.py: the protocol's structs; nodes.py: node ids to
paths; kernelattrs.py: the attributes the kernel holds; pins.py: the versions read through files
the kernel opened without asking) with the operations of interface.py. Those modules are the
protocol layer, which knows nothing else of Strata. operations.py implements the interface
with the client library, by path, one part per concern over their shared state (state.py):
metadata (attributes.py, attrcache.py), calls on open files (files.py), reads that came
without an open (reads.py), directories (directories.py), extended attributes (xattrs.py),
with the errno of each error (errnos.py), listings fetched ahead of a walk (prefetch.py) and the
folders whose listing the kernel may answer from (dirlistings.py); handles.py holds open files; openreads.py counts
what open read handles read, for the page cache; settings.py holds the process's settings;
mountkeeper.py keeps a mount's connection across server restarts, and keeperhost.py
(`strata fuse-holder`) starts the keepers of a node's mounts outside the CSI plugin's pod;
mountpoints.py finds, probes and unmounts mount points (also used by the CSI plugin);
locations.py formats the `user.strata.locations` extended attribute.
"""
