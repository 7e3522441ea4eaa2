"""The Strata namespace (or one subtree of it) as a POSIX file system: the operations the FUSE
session (session.py) calls by path, answered with the client library.

One class made of one part per concern: what they share (state.py), metadata (attributes.py,
attrcache.py), calls on open files (files.py), reads that came without an open of this
process (reads.py), directories (directories.py) and extended attributes (xattrs.py). A
read-only mount (`--read-only`, or a Strata mount with readOnly) refuses changes with EROFS.
"""

from __future__ import annotations

from .attributes import Attributes
from .directories import Directories
from .files import Files
from .xattrs import ExtendedAttributes


class StrataOperations(Files, Attributes, Directories, ExtendedAttributes):
    """Paths are below the mount point ("/" is the mount's root); times are in nanoseconds."""
