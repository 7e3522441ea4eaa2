"""Names and numbers of Strata that users, the operator and the servers rely on (DESIGN.md),
each written once: ports, the Kubernetes API (group, kinds), Secret keys, environment
variables, the default block size."""

from typing import Final

MASTER_RPC_PORT: Final = 19998
MASTER_HTTP_PORT: Final = 19999
WORKER_RPC_PORT: Final = 29999
WORKER_HTTP_PORT: Final = 30000
# Block bytes over plain TCP (worker/transfer.py): what clients read blocks from.
WORKER_DATA_PORT: Final = 30001

GRPC_PACKAGE: Final = "strata.v1"
FSSPEC_PROTOCOL: Final = "strata"

# Every RPC carries `authorization: Bearer <token>`; the token names the caller's role.
AUTH_METADATA_KEY: Final = "authorization"
AUTH_SCHEME: Final = "Bearer"

# The Kubernetes API (crds/): CacheCluster and Mount objects.
GROUP: Final = "strata.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CACHE_CLUSTER_KIND: Final = "CacheCluster"
CACHE_CLUSTER_PLURAL: Final = "cacheclusters"
MOUNT_KIND: Final = "Mount"
MOUNT_PLURAL: Final = "mounts"
# A Mount's status.phase once the master serves it.
MOUNTED_PHASE: Final = "Mounted"

# A cluster's credentials Secret: CacheCluster demo -> Secret demo-auth.
AUTH_SECRET_SUFFIX: Final = "-auth"


def auth_secret_name(cluster: str) -> str:
    return f"{cluster}{AUTH_SECRET_SUFFIX}"


# The data tokens of every CacheCluster, which the operator keeps for the node plugin in one
# Secret of its own namespace (the plugin may read that one Secret, no other): one key per
# cluster. Namespace names hold no dots, so the first dot ends the namespace.
def data_token_key(namespace: str, cluster: str) -> str:
    return f"{namespace}.{cluster}"


# Keys of a cluster's credentials Secret (`<cluster>-auth` in Kubernetes): the admin token
# under the key every cluster had from the start, then the data and internal ones (auth.py).
SECRET_ADMIN_TOKEN_KEY: Final = "token"
SECRET_DATA_TOKEN_KEY: Final = "dataToken"
SECRET_INTERNAL_TOKEN_KEY: Final = "internalToken"

ENV_PREFIX: Final = "STRATA_"
ENV_MASTER: Final = "STRATA_MASTER"
ENV_TOKEN: Final = "STRATA_TOKEN"
ENV_TOKEN_FILE: Final = "STRATA_TOKEN_FILE"
# The data credential (read and write files) and the credential servers use among
# themselves (auth.py); each with a *_FILE twin.
ENV_DATA_TOKEN: Final = "STRATA_DATA_TOKEN"
ENV_DATA_TOKEN_FILE: Final = "STRATA_DATA_TOKEN_FILE"
ENV_INTERNAL_TOKEN: Final = "STRATA_INTERNAL_TOKEN"
ENV_INTERNAL_TOKEN_FILE: Final = "STRATA_INTERNAL_TOKEN_FILE"
ENV_HOSTNAME: Final = "STRATA_HOSTNAME"
ENV_HOME: Final = "STRATA_HOME"

DEFAULT_BLOCK_SIZE: Final = 16 * 1024 * 1024
# The same as people write it (strata.yaml, the CRDs, flags): 16Mi.
DEFAULT_BLOCK_SIZE_QUANTITY: Final = f"{DEFAULT_BLOCK_SIZE // 2**20}Mi"
# Block bytes (ReadBlock) and a written file's bytes (WriteFile, AppendFile) stream in
# messages this big: few enough that per-message cost stays small. Clients' channels take
# up to 64 MiB; a worker takes one piece and the fields beside it, no more (the cache
# server's rpcutil.WORKER_MAX_RECEIVE_BYTES).
STREAM_CHUNK_SIZE: Final = 4 * 1024 * 1024
# Blocks a worker fetches ahead of one read at the most (cachePolicy.readaheadBlocks, and the
# readahead a ReadBlock or data-port request asks for; more is cut to this). 64 blocks (1 GiB
# at the default block size) is far more than a reader consumes before its next request
# reaches the worker; without a bound one request queued a fetch for every block of a
# large file.
MAX_READAHEAD_BLOCKS: Final = 64

# The namespace's limits on a path, in bytes of its UTF-8: each name (a component between
# slashes) and the whole path as the caller gives it. Those of Linux (NAME_MAX, PATH_MAX), so
# that every path of the namespace can be shown through FUSE. Clients check them before
# sending and servers on receipt (InvalidArgument naming the limit). A store may keep lower
# ones (S3 keys: 1024 bytes); it refuses a longer name with InvalidArgument too.
MAX_NAME_BYTES: Final = 255
MAX_PATH_BYTES: Final = 4096

# ASYNC_THROUGH uploads land in this folder of the mount's store first; the master moves
# each into place once it is whole (so an upload of a removed or replaced file never shows).
# Listings never show it.
UPLOAD_DIR: Final = ".strata-uploads"

MEDIA: Final = ("MEM", "SSD", "HDD")  # fastest first
XATTR_LOCATIONS: Final = "user.strata.locations"
