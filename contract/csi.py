"""Names of the CSI driver (the cache server's node plugin, strata.cacheserver.csi) that
Kubernetes objects, the operator and users rely on."""

from typing import Final

from .constants import SECRET_ADMIN_TOKEN_KEY, SECRET_DATA_TOKEN_KEY

DRIVER_NAME: Final = "csi.strata.dev"
# NodeGetInfo reports the node under this topology key (kubelet labels the Node with it).
TOPOLOGY_KEY: Final = "topology.strata.dev/node"

# Volume attributes (inline volumes, PVs) and StorageClass parameters.
ATTR_MOUNT: Final = "mount"              # name of a Mount (constants.API_VERSION)
ATTR_NAMESPACE: Final = "namespace"      # the Mount's namespace (default: the pod's / PVC's)
ATTR_SUBPATH: Final = "subPath"          # a directory below the Mount's path
ATTR_MASTER: Final = "masterAddress"     # without a Mount: the master's HOST:PORT ...
ATTR_PATH: Final = "path"                # ... and the namespace path to show
ATTR_READ_ONLY: Final = "readOnly"       # "true": mount read-only
ATTR_WRITE_TYPE: Final = "writeType"     # MUST_CACHE | CACHE_THROUGH | THROUGH | ASYNC_THROUGH
# "true": the kernel reads files of 1 MiB or more from local copies on the node (FUSE
# passthrough; read-only volumes, where the node plugin keeps copies: `strata csi --passthrough`).
ATTR_PASSTHROUGH: Final = "passthrough"
# Read by the operator, not the node plugin: hold the pod (a scheduling gate) until this
# percentage of the volume's data is cached, or at most warmTimeout (a duration).
ATTR_WARM_PERCENT: Final = "warmPercent"
ATTR_WARM_TIMEOUT: Final = "warmTimeout"
# Secrets (nodePublishSecretRef, provisioner secrets, `<cluster>-auth`): the data credential
# (read and write files) under SECRET_DATA_TOKEN, the only one a volume uses. A volume's own
# secrets may name it SECRET_TOKEN instead (a Secret made for one volume).
SECRET_DATA_TOKEN: Final = SECRET_DATA_TOKEN_KEY
SECRET_TOKEN: Final = SECRET_ADMIN_TOKEN_KEY
# Set by kubelet when the CSIDriver has podInfoOnMount, and by the external-provisioner
# with --extra-create-metadata.
POD_NAMESPACE: Final = "csi.storage.k8s.io/pod.namespace"
PVC_NAMESPACE: Final = "csi.storage.k8s.io/pvc/namespace"
RESERVED_PREFIX: Final = "csi.storage.k8s.io/"

# Volumes made by CreateVolume have ids with this prefix.
VOLUME_ID_PREFIX: Final = "strata-"
MOUNT_ALLOWED_NAMESPACES: Final = "allowedNamespaces"  # Mount spec: namespaces granted its use
