"""Reconcile steps: ensure children, talk to masters, write status. Called by the handlers."""

from __future__ import annotations

from strata.operator.reconcile.cluster import reconcile_cluster
from strata.operator.reconcile.common import Deps, ObjectState, Outcome
from strata.operator.reconcile.mount import reconcile_mount, remove_mount

__all__ = ["Deps", "ObjectState", "Outcome", "reconcile_cluster", "reconcile_mount", "remove_mount"]
