"""Names and numbers of the cache server that users and the operator rely on (DESIGN.md)."""

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
# Blocks stream in messages this big: few enough that per-message cost stays small, and
# under the 64 MiB message limit every Strata channel sets (rpcutil.CHANNEL_OPTIONS).
STREAM_CHUNK_SIZE: Final = 4 * 1024 * 1024

# ASYNC_THROUGH uploads land in this folder of the mount's store first; the master moves
# each into place once it is whole (so an upload of a removed or replaced file never shows).
# Listings never show it.
UPLOAD_DIR: Final = ".strata-uploads"

MEDIA: Final = ("MEM", "SSD", "HDD")  # fastest first
XATTR_LOCATIONS: Final = "user.strata.locations"
