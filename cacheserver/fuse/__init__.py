"""FUSE: the Strata namespace as POSIX files (`strata fuse MOUNTPOINT`).

daemon.py runs a mount; kernel.py mounts and ends connections; session.py answers the
kernel's requests (wire.py: the protocol's structs; nodes.py: node ids to paths; shown.py: the
attributes the kernel holds) with the operations of interface.py. Those modules are the
protocol layer, which knows nothing else of Strata. operations.py implements the interface
with the client library, by path; handles.py holds open files; openreads.py counts what open
read handles read, for the page cache; keeper.py keeps a mount's connection across server
restarts; mountpoints.py finds, probes and unmounts mount
points (also used by the CSI plugin); locations.py formats the `user.strata.locations`
extended attribute.
"""
