"""FUSE: the Strata namespace as POSIX files (`strata fuse MOUNTPOINT`).

daemon.py runs a mount; kernel.py mounts and ends connections; session.py answers the
kernel's requests (wire.py: the protocol's structs; nodes.py: node ids to paths) with
operations.py, which does the work by path; handles.py holds open files; keeper.py keeps a
mount's connection across server restarts; mountpoints.py finds, probes and unmounts mount
points (also used by the CSI plugin); locations.py formats the `user.strata.locations`
extended attribute.
"""
