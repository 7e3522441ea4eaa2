"""FUSE: the Strata namespace as POSIX files (`strata fuse MOUNTPOINT`).

daemon.py runs a mount, operations.py answers libfuse's callbacks, handles.py holds open
files, mountpoints.py finds, probes and unmounts mount points (also used by the CSI plugin),
locations.py formats the `user.strata.locations` extended attribute.
"""
