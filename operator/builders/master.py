"""The master: a one-pod StatefulSet and its headless Service."""

from __future__ import annotations

from strata.operator import constants as c
from strata.operator.builders.common import Manifest, master_name
from strata.operator.builders.pods import headless_service, http_probes, ports, server_statefulset
from strata.operator.models import Cluster, ClusterTokens
from strata.operator.settings import OperatorSettings

JOURNAL_VOLUME = "journal"


def build_master_service(cluster: Cluster) -> Manifest:
    return headless_service(
        cluster, master_name(cluster.ref.name), c.COMPONENT_MASTER, rpc=c.MASTER_RPC_PORT, http=c.MASTER_HTTP_PORT
    )


def build_master_statefulset(cluster: Cluster, settings: OperatorSettings, tokens: ClusterTokens) -> Manifest:
    """The journal lives in an emptyDir: a restarted master gets its mount table back from
    the Mount objects, which the operator re-applies on its timer."""
    master = cluster.spec.master
    container = {
        "name": c.COMPONENT_MASTER,
        "args": ["master", "--config", f"{c.CONFIG_DIR}/{c.CONFIG_FILE}", "--journal-dir", c.JOURNAL_DIR],
        "ports": ports(rpc=c.MASTER_RPC_PORT, http=c.MASTER_HTTP_PORT),
        "volumeMounts": [{"name": JOURNAL_VOLUME, "mountPath": c.JOURNAL_DIR}],
        **http_probes("http"),
    }
    return server_statefulset(
        cluster,
        settings,
        name=master_name(cluster.ref.name),
        component=c.COMPONENT_MASTER,
        pod=master,
        container=container,
        volumes=[{"name": JOURNAL_VOLUME, "emptyDir": {}}],
        affinity=master.affinity,
        tokens=tokens,
    )
