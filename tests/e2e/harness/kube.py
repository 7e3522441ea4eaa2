"""A small JSON client for the API server, used only by the node agent.

It speaks plain REST with the admin client certificate and hands back dicts,
which is all a kubelet-like agent needs (get, list, watch, create, patch,
delete). The e2e tests use the official client and kubectl instead.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import requests

from harness.pki import KeyPair

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class Kube:
    def __init__(self, server: str, ca: str, user: KeyPair) -> None:
        self.server = server.rstrip("/")
        self._local = threading.local()
        self._ca = ca
        self._cert = (str(user.cert), str(user.key))

    @property
    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # No proxies, and no REQUESTS_CA_BUNDLE taking over from our CA.
            session.trust_env = False
            session.verify = self._ca
            session.cert = self._cert
            self._local.session = session
        return session

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Obj | list[Any] | None = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Obj:
        resp = self._session.request(
            method,
            self.server + path,
            data=json.dumps(body) if body is not None else None,
            params=params,
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=timeout,
        )
        if resp.status_code >= 300:
            raise ApiError(resp.status_code, method, path, resp.text)
        result: Obj = resp.json() if resp.content else {}
        return result

    def get(self, path: str, **params: str) -> Obj:
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body=body)

    def patch(self, path: str, body: Obj | list[Any], kind: str = "strategic-merge-patch") -> Obj:
        return self.request("PATCH", path, body=body, content_type=f"application/{kind}+json")

    def delete(self, path: str, body: Obj | None = None) -> Obj | None:
        try:
            return self.request("DELETE", path, body=body)
        except ApiError as exc:
            if exc.status in (404, 409):
                return None
            raise

    def watch(
        self, path: str, resource_version: str, params: dict[str, str], timeout_seconds: int = 60
    ) -> Iterator[Obj]:
        """Yield watch events until the server closes the stream."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **params,
        }
        with self._session.get(
            self.server + path, params=query, stream=True, timeout=(10, timeout_seconds + 30)
        ) as resp:
            if resp.status_code >= 300:
                raise ApiError(resp.status_code, "WATCH", path, resp.text)
            for line in resp.iter_lines():
                if line:
                    yield json.loads(line)


class Reflector:
    """Keeps a dict of the objects at `path` current (list, then watch; a
    re-list on expiry or error) and calls `on_change(obj, deleted)` for each
    change. Runs in its own daemon thread until `stop` is set."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        on_change: Callable[[Obj, bool], None],
        stop: threading.Event,
        **params: str,
    ) -> None:
        self.kube, self.path, self.on_change, self.stop, self.params = kube, path, on_change, stop, params
        self.items: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"reflector{path}", daemon=True)

    @staticmethod
    def key(obj: Obj) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.items.values())

    def start(self) -> Reflector:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                listing = self.kube.get(self.path, **self.params)
                fresh = {self.key(o): o for o in listing.get("items", [])}
                with self.lock:
                    gone = [o for k, o in self.items.items() if k not in fresh]
                    self.items = fresh
                for obj in gone:
                    self.on_change(obj, True)
                for obj in fresh.values():
                    self.on_change(obj, False)
                self.synced.set()
                rv = listing["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    for event in self.kube.watch(self.path, rv, self.params):
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            raise ApiError(obj.get("code", 500), "WATCH", self.path, json.dumps(obj))
                        rv = obj["metadata"]["resourceVersion"]
                        if kind == "BOOKMARK":
                            continue
                        with self.lock:
                            if kind == "DELETED":
                                self.items.pop(self.key(obj), None)
                            else:
                                self.items[self.key(obj)] = obj
                        self.on_change(obj, kind == "DELETED")
                        if self.stop.is_set():
                            return
            except Exception:  # noqa: BLE001 - re-list after any failure
                if self.stop.wait(0.5):
                    return
