"""What every reconcile step shares: its dependencies, per-object state, its outcome, and
writing status only when it changed."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from strata.operator import constants as c
from strata.operator.builders.common import auth_name
from strata.operator.drain import Drains
from strata.operator.kube import KubeAPI
from strata.operator.master import Masters
from strata.operator.settings import OperatorSettings
from strata.operator.status import Note, Problem


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Deps:
    """The world a reconcile step acts on."""

    kube: KubeAPI
    masters: Masters
    settings: OperatorSettings
    clock: Callable[[], datetime] = utcnow
    # The workers that drain (their node cordoned, their pod evicted), from the watches.
    drains: Drains = field(default_factory=Drains)


@dataclass(frozen=True)
class Retry:
    """When to try something again, and how many tries failed so far (for the backoff)."""

    at: datetime
    failures: int
    problem: Problem  # what went wrong last


@dataclass
class ObjectState:
    """What the operator remembers about one object between reconciles (in memory only)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Mount: digest of the last MountRequest the master accepted, and the mount id it gave.
    fingerprint: str | None = None
    mount_id: int | None = None
    # Mount: preload paths that failed or lost their bytes, and when to load them again.
    preload_retries: dict[str, Retry] = field(default_factory=dict)
    # Mount: since when its store has not answered (None while it does).
    store_away_since: datetime | None = None
    # Mount: the scheduled time whose preload run this operator started last (a run the
    # master timed a little early by its clock is not started twice).
    scheduled_run: datetime | None = None


@dataclass(frozen=True)
class Outcome:
    """How a reconcile ended: done, waiting (retry soon), or stalled (a person must act);
    with the Events the status it wrote tells of (the handlers post them)."""

    done: bool
    message: str = ""
    stalled: bool = False
    notes: tuple[Note, ...] = ()
    # Seconds after which to reconcile again at the latest (a scheduled run is due), if
    # sooner than the handlers' own pace.
    recheck_in: float | None = None

    def telling(self, notes: Sequence[Note]) -> Outcome:
        return replace(self, notes=tuple(notes))

    def again_in(self, seconds: float | None) -> Outcome:
        return replace(self, recheck_in=seconds)

    @classmethod
    def ok(cls, message: str = "") -> Outcome:
        return cls(True, message)

    @classmethod
    def waiting(cls, message: str) -> Outcome:
        return cls(False, message)

    @classmethod
    def stuck(cls, message: str) -> Outcome:
        return cls(False, message, stalled=True)


@dataclass(frozen=True)
class ObjectKey:
    """The parts of an object's metadata reconciles use."""

    name: str
    namespace: str
    uid: str
    generation: int
    deleting_since: str | None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ObjectKey:
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta.get("uid", ""), int(meta.get("generation", 0)),
                   meta.get("deletionTimestamp"))


async def write_status(
    deps: Deps, kind: str, key: ObjectKey, previous: Mapping[str, Any], status: dict[str, Any]
) -> bool:
    """Apply `status` if it differs from what is stored; say whether it was written."""
    if dict(previous) == status:
        return False
    await deps.kube.apply_status(c.API_VERSION, kind, key.namespace, key.name, status)
    return True


def secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's keys and decoded values (values that are not UTF-8 text are skipped)."""
    out = {}
    for k, v in (secret.get("data") or {}).items():
        try:
            out[k] = base64.b64decode(v).decode()
        except (binascii.Error, UnicodeDecodeError):
            continue
    return out


async def read_secret_tokens(deps: Deps, namespace: str, cluster: str) -> dict[str, str]:
    """The tokens in the cluster's `<cluster>-auth` Secret by key (none before it exists)."""
    secret = await deps.kube.get("v1", "Secret", namespace, auth_name(cluster))
    if secret is None:
        return {}
    return {k: v for k, v in secret_data(secret).items() if v}


async def read_token(deps: Deps, namespace: str, cluster: str) -> str | None:
    """The cluster's admin token (what the operator presents), if its Secret exists yet."""
    return (await read_secret_tokens(deps, namespace, cluster)).get(c.TOKEN_KEY)
