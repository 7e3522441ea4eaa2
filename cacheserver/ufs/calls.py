"""How every call to a store runs: on the store's own threads when it blocks, retried on
transient failures, within a deadline (bounded calls) or until it stops making progress
(`Progress`), timed into the store metrics, its failures translated (`errors`) and the
Mount's credentials cut out of every message."""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from strata.contract.errors import DeadlineExceeded, StrataError, Unavailable
from strata.contract.urls import shown_url
from ..retry import call_with_backoff
from ..settings import RetrySettings, StoreTimeouts
from ..storemetrics import STORE_METRICS
from .errors import translate

T = TypeVar("T")

# Operations whose work is bounded (one object's status, one folder's entries, one block's
# bytes): a reader waits on them, so they get StoreTimeouts.deadline. The others (uploads of
# any size, walks of whole trees, copies) are bounded by the read timeout of each request
# (S3), or by their progress (file://, StoreTimeouts.stall_timeout).
_BOUNDED = frozenset({"check", "info", "list", "read"})
# Threads one store's blocking calls may hold at once (see StoreThreads): as many as a busy
# worker runs against one store (readahead, loads and readers' misses), few enough that a
# hung store does not hold many.
STORE_THREADS = 16
# Characters a credential's value must have to be cut out of messages: shorter ones ("1",
# "on") would cut ordinary words and numbers, and tell nothing.
_SHOWN_SECRET = 4


class StoreThreads(Executor):
    """The threads one store's blocking calls (file://, memory://, ...) run on: at most
    `limit`, started as needed, daemons. A store that stops answering (a hung NFS server)
    holds its calls' threads for as long as it hangs; with threads of its own it holds
    only these, and its further calls wait here until their deadline, while other mounts'
    stores and the block cache (the event loop's default threads) go on."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit = limit
        self._name = name
        self._lock = threading.Lock()
        self._started = 0
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False) and self._started < self._limit:
                self._started += 1
                threading.Thread(target=self._run, args=(self._work, self._idle), daemon=True,
                                 name=f"{self._name}-{self._started}").start()
        return future

    @staticmethod
    def _run(work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None],
             idle: threading.Semaphore) -> None:
        while (item := work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():  # not cancelled while it waited
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)
            del item, future, call
            idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let the threads end once the calls queued so far ran (a hung one never does); a
        later call starts new ones."""
        with self._lock:
            for _ in range(self._started):
                self._work.put(None)
            self._work, self._idle, self._started = queue.SimpleQueue(), threading.Semaphore(0), 0


class Progress:
    """How far a long file:// call (an upload, copy, move, delete or walk) has come: it
    reports each step (a MiB written, a folder listed or emptied), and `Store._call` gives
    up on a call that reported none for `StoreTimeouts.stall_timeout`. A call given up on
    stops at its next step, leaving nothing made (its thread goes on only once the store
    answers again)."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.given_up = False

    def step(self) -> None:
        if self.given_up:
            raise DeadlineExceeded("the caller gave up on this store call; what it made is dropped")
        self.at = time.monotonic()


class StoreCalls:
    """The calls of one store (`source`, the shown URL of the folder `root`): what every
    backend's operations go through."""

    def __init__(self, source: str, root: str, *, secrets: Iterable[str], endpoint: str | None,
                 retry: RetrySettings, timeouts: StoreTimeouts, threads: StoreThreads | None) -> None:
        self.source = source
        self._root = root
        # Values no message may show: a credential that turns up in a store's error (an
        # endpoint, a key echoed back) is cut out of it (`_redacted`), and so is the user-info
        # of the source URL (a store's error may quote the URL it was given).
        self._secrets = sorted({v for v in secrets if len(v) >= _SHOWN_SECRET}, key=len, reverse=True)
        self._endpoint = endpoint
        self._retry = retry
        self._timeouts = timeouts
        self._threads = threads

    def _redacted(self, text: str) -> str:
        """`text` without any value of the mount's credentials."""
        for value in self._secrets:
            text = text.replace(value, "<a value from the Mount's credentials>")
        return text

    def _shows_secret(self, exc: BaseException) -> bool:
        """Does `exc`, or an error it was raised from, show a value of the mount's credentials?"""
        seen: set[int] = set()
        at: BaseException | None = exc
        while at is not None and id(at) not in seen:
            if any(value in str(at) for value in self._secrets):
                return True
            seen.add(id(at))
            at = at.__cause__ or at.__context__
        return False

    def _redacted_error(self, exc: Exception) -> StrataError:
        """A StrataError of `exc`'s kind whose message has the credentials' values cut out."""
        kind = type(exc) if isinstance(exc, StrataError) else StrataError
        return kind(self._redacted(str(exc)))

    def _shown_endpoint(self) -> str:
        """Where the store is reached, for messages: its endpoint (unless a credential) or source."""
        return self._redacted(shown_url(str(self._endpoint or self.source)))

    def url(self, rel: str) -> str:
        """The store URL of a path relative to the mount root (for messages)."""
        return f"{self.source.rstrip('/')}/{rel}" if rel else self.source

    async def _blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on this store's own threads (StoreThreads)."""
        assert self._threads is not None, f"{self.source} is an async store"
        return await asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))

    def _translate(self, exc: Exception, rel: str, what: str) -> Exception:
        """The Strata error for a store failure, or `exc` itself when none fits."""
        return translate(exc, what, self.url(rel), store=self.source, bucket=self._root.split("/", 1)[0],
                         where=self._shown_endpoint)

    async def _call(self, what: str, rel: str, fn: Callable[[], Awaitable[T]], *, progress: Progress | None = None) -> T:
        """Run one store operation with retries on transient errors and mapped errors,
        within the deadline when its size is bounded (see `_BOUNDED`), else, given the
        `progress` it reports, until it makes none for the stall timeout (`_call_with_progress`)."""

        async def attempt() -> T:
            try:
                return await fn()
            except Exception as exc:
                mapped = self._translate(exc, rel, what)
                if self._shows_secret(exc) or self._shows_secret(mapped):
                    raise self._redacted_error(mapped) from None  # nothing chained shows it either
                if mapped is exc:
                    raise
                raise mapped from exc

        started = time.monotonic()
        try:
            result = await self._retried(attempt, what, rel, progress)
        except BaseException as exc:
            error = type(exc).__name__ if isinstance(exc, StrataError) else "Cancelled" if isinstance(
                exc, asyncio.CancelledError) else "Internal"
            STORE_METRICS.observe(what, time.monotonic() - started, error)
            raise
        STORE_METRICS.observe(what, time.monotonic() - started)
        return result

    async def _retried(self, attempt: Callable[[], Awaitable[T]], what: str, rel: str,
                       progress: Progress | None) -> T:
        """`attempt` with retries, within the deadline or the stall timeout (see `_call`)."""
        retried = call_with_backoff(
            attempt,
            what=f"{what} {self.url(rel)}",
            attempts=self._retry.attempts,
            base_delay=self._retry.base_delay,
            max_delay=self._retry.max_delay,
            retry_on=(Unavailable,),
        )
        if what not in _BOUNDED:
            return await (retried if progress is None else self._until_stalled(retried, what, rel, progress))
        deadline = self._timeouts.deadline
        try:
            return await asyncio.wait_for(retried, deadline)
        except TimeoutError as exc:  # the deadline; attempts' own timeouts are Unavailable
            raise DeadlineExceeded(
                f"store {self.source} did not answer {what} of {self.url(rel)} within {deadline:g}s "
                f"(at {self._shown_endpoint()}; STRATA_STORE_DEADLINE sets this limit)"
            ) from exc

    async def _call_with_progress(self, what: str, rel: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs, progress=...)`, a file:// operation of any size, on this
        store's threads as the store operation `what` of `rel`: given up on once it reports
        no progress (`Progress`) for the stall timeout."""
        progress = Progress()
        return await self._call(what, rel, lambda: self._blocking(fn, *args, progress=progress, **kwargs),
                                progress=progress)

    async def _until_stalled(self, work: Awaitable[T], what: str, rel: str, progress: Progress) -> T:
        """`work`'s result, or DeadlineExceeded once `progress` went unreported for
        StoreTimeouts.stall_timeout (the work is told it was given up on)."""
        task = asyncio.ensure_future(work)
        limit = self._timeouts.stall_timeout
        try:
            while not task.done():
                quiet = time.monotonic() - progress.at
                if quiet >= limit:
                    break
                await asyncio.wait({task}, timeout=limit - quiet)
            else:
                return task.result()
        finally:
            if not task.done():
                progress.given_up = True
                task.cancel()
        raise DeadlineExceeded(
            f"store {self.source} did not answer {what} of {self.url(rel)}: no progress for {limit:g}s (its file "
            "server stopped answering?; STRATA_STORE_STALL_TIMEOUT sets this limit)"
        )
