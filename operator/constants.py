"""Names the operator and its users rely on: API group, labels, finalizer, conditions, reasons.

Everything a person can see on an object (condition types, reasons, phases, label keys) is
spelled once here, so the handlers, the status code and the tests agree.
"""

from __future__ import annotations

from typing import Final

from strata.contract import constants as contract

# The API group and its kinds are the contract's (strata.contract.constants).
GROUP: Final = contract.GROUP
VERSION: Final = contract.VERSION
API_VERSION: Final = contract.API_VERSION

CACHE_CLUSTER_KIND: Final = contract.CACHE_CLUSTER_KIND
CACHE_CLUSTER_PLURAL: Final = contract.CACHE_CLUSTER_PLURAL
MOUNT_KIND: Final = contract.MOUNT_KIND
MOUNT_PLURAL: Final = contract.MOUNT_PLURAL

FINALIZER: Final = f"{GROUP}/finalizer"
FIELD_MANAGER: Final = "strata-operator"
# kopf keeps its handler progress in annotations under this prefix (never in `status`).
ANNOTATION_PREFIX: Final = GROUP
# Pod template annotation: a hash of strata.yaml, so a config change rolls the pods.
CONFIG_HASH_ANNOTATION: Final = f"{GROUP}/config-hash"
# Where a Prometheus without the Prometheus Operator finds a pod's metrics.
SCRAPE_ANNOTATION: Final = "prometheus.io/scrape"
SCRAPE_PORT_ANNOTATION: Final = "prometheus.io/port"
SCRAPE_PATH_ANNOTATION: Final = "prometheus.io/path"
METRICS_PATH: Final = "/metrics"

# Recommended labels (app.kubernetes.io/*) on every child.
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
APP_NAME: Final = "strata"
MANAGED_BY: Final = "strata-operator"
COMPONENT_MASTER: Final = "master"
COMPONENT_WORKER: Final = "worker"
COMPONENT_JOURNAL: Final = "journal"

# Server image command lines and paths inside the pods (the server image's contract).
CONFIG_DIR: Final = "/etc/strata"
CONFIG_FILE: Final = "strata.yaml"
AUTH_DIR: Final = "/etc/strata/auth"
# Keys of the `<cluster>-auth` Secret: admin (the operator's), data (volumes'), internal
# (the servers' among themselves). Each is a file of that name in AUTH_DIR of the pods.
TOKEN_KEY: Final = contract.SECRET_ADMIN_TOKEN_KEY
DATA_TOKEN_KEY: Final = contract.SECRET_DATA_TOKEN_KEY
INTERNAL_TOKEN_KEY: Final = contract.SECRET_INTERNAL_TOKEN_KEY
JOURNAL_DIR: Final = "/var/lib/strata/journal"
DATA_DIR: Final = "/var/lib/strata"
# The worker's staging folder under DATA_DIR (cacheserver/worker/uploads.py, STAGING_FOLDER):
# staged writes and the records of ASYNC_THROUGH uploads, on a volume of their own.
STAGING_DIR: Final = "/var/lib/strata/staging"
TIERS_DIR: Final = "/var/lib/strata/tiers"
SHORT_CIRCUIT_DIR: Final = "/var/lib/strata/sc"
SHORT_CIRCUIT_HOST_ROOT: Final = "/var/run/strata"
# The non-root user of the server image (Dockerfile.server) that runs master and workers.
SERVER_UID: Final = 10001

MASTER_RPC_PORT: Final = contract.MASTER_RPC_PORT
MASTER_HTTP_PORT: Final = contract.MASTER_HTTP_PORT
WORKER_RPC_PORT: Final = contract.WORKER_RPC_PORT
WORKER_HTTP_PORT: Final = contract.WORKER_HTTP_PORT
WORKER_DATA_PORT: Final = contract.WORKER_DATA_PORT

# Condition types. Ready/Reconciling/Stalled follow kstatus (read by Argo CD and Flux).
READY: Final = "Ready"
RECONCILING: Final = "Reconciling"
STALLED: Final = "Stalled"
MASTER_READY: Final = "MasterReady"
WORKERS_READY: Final = "WorkersReady"
PRELOADED: Final = "Preloaded"


class ClusterPhase:
    PENDING: Final = "Pending"
    PROVISIONING: Final = "Provisioning"
    READY: Final = "Ready"
    DEGRADED: Final = "Degraded"
    TERMINATING: Final = "Terminating"


class MountPhase:
    PENDING: Final = "Pending"
    MOUNTED: Final = contract.MOUNTED_PHASE
    FAILED: Final = "Failed"
    UNMOUNTING: Final = "Unmounting"


class PreloadPhase:
    PENDING: Final = "Pending"
    RUNNING: Final = "Running"
    SUCCEEDED: Final = "Succeeded"
    FAILED: Final = "Failed"


class Reason:
    """Condition reasons: CamelCase, each names what happened so a person can act."""

    # CacheCluster
    AS_EXPECTED: Final = "AsExpected"
    INVALID_SPEC: Final = "InvalidSpec"
    APPLY_FAILED: Final = "ApplyFailed"
    WAITING_FOR_MASTER: Final = "WaitingForMaster"
    MASTER_UNREACHABLE: Final = "MasterUnreachable"
    JOURNAL_CLAIM_PENDING: Final = "JournalClaimPending"
    WAITING_FOR_WORKERS: Final = "WaitingForWorkers"
    WORKERS_NOT_REGISTERED: Final = "WorkersNotRegistered"
    WORKERS_DECOMMISSIONED: Final = "WorkersDecommissioned"
    SCALING_IN: Final = "ScalingIn"
    ROLLING_OUT: Final = "RollingOut"
    DECOMMISSION_FAILED: Final = "DecommissionFailed"
    TERMINATING: Final = "Terminating"
    # Mount
    CLUSTER_NOT_FOUND: Final = "ClusterNotFound"
    CLUSTER_NOT_READY: Final = "ClusterNotReady"
    CREDENTIALS_NOT_FOUND: Final = "CredentialsSecretNotFound"
    SOURCE_NOT_FOUND: Final = "SourceNotFound"
    STORE_UNREACHABLE: Final = "StoreUnreachable"
    ACCESS_DENIED: Final = "AccessDenied"
    INVALID_MOUNT: Final = "InvalidMount"
    PATH_CONFLICT: Final = "PathConflict"
    TOKEN_REJECTED: Final = "TokenRejected"
    SOURCE_NOT_ALLOWED: Final = "SourceNotAllowed"
    MOUNT_FAILED: Final = "MountFailed"
    MOUNTED: Final = "Mounted"
    UNMOUNTING: Final = "Unmounting"
    PRELOADING: Final = "Preloading"
    PRELOADED: Final = "Preloaded"
    PRELOAD_FAILED: Final = "PreloadFailed"
    PRELOAD_INCOMPLETE: Final = "PreloadIncomplete"
