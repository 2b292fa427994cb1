"""How a live stream is served, apart from what it says: its bounds in time (a `Lease`),
the thread Django gave the request (let go under ASGI; or a few threads shared by every
stream request of the process: `stream_threads`), and a synchronous iterator for WSGI
servers (`SyncStream`)."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext

from ..conf import agentrun_settings
from ..streams.reader import close_hub
from .stream_checks import close_checks
from .stream_reads import close_connections


class Lease:
    """One stream's bounds: when it ends (its lifetime) and its place among the user's open
    streams (renewed by the user's re-checks, stream_checks.py; released when it ends)."""

    def __init__(self, asgi: bool) -> None:
        self.asgi = asgi
        now = time.monotonic()
        longest = agentrun_settings.STREAM_MAX_SECONDS
        longest = math.inf if longest is None else float(longest)
        if not asgi:  # each WSGI stream holds a worker thread
            longest = min(longest, float(agentrun_settings.STREAM_WSGI_MAX_SECONDS))
        self.ends_at = now + longest
        # A place lapses this long after its last renewal (a web process that died).
        self.lapse = float(agentrun_settings.STREAM_RECHECK_SECONDS) * 3 + 30
        self.place: Any = None

    async def release(self) -> None:
        if self.place is not None:
            await self.place.release()


def release_request_thread() -> None:
    """Under ASGI, Django runs a request's synchronous parts (the `request_started` signal's
    receivers, synchronous middleware) on a thread of the request's own (asgiref's
    ThreadSensitiveContext), kept until the response has been sent: for a stream, its whole
    life (300 streams held 308 threads). Its work is done when the body starts: close its
    database connections and let the thread go. Whatever of this request still needs one
    (closing the response) gets a new thread then."""
    # asgiref's own bookkeeping (3.x): read defensively, a release without it keeps the thread.
    context_var = getattr(SyncToAsync, "thread_sensitive_context", None)
    executors = getattr(SyncToAsync, "context_to_thread_executor", None)
    context = context_var.get(None) if context_var is not None else None
    if context is None or executors is None:
        return
    if executors.get(context) in _SHARED:
        return  # one of stream_threads' few threads: it stays
    executor = executors.pop(context, None)
    if executor is not None:
        executor.submit(close_connections)
        executor.shutdown(wait=False)


# The requests of live streams (a run's, a conversation's).
STREAM_PATH = re.compile(r"/(runs|conversations)/[^/]+/stream/?$")
SHARED_THREADS = 4
_SHARED: list[ThreadPoolExecutor] = []
TAKES_EXECUTOR = "executor" in inspect.signature(ThreadSensitiveContext).parameters


def stream_threads(application: Any) -> Any:
    """`application` (an ASGI app: Django's) with the synchronous parts of every stream
    request (synchronous middleware, the `request_started` signal) run on a few threads
    shared by all of them (SHARED_THREADS), instead of a thread of each request's own that
    Django makes and keeps while the request starts: 2,000 watchers connecting at once
    held 2,000 threads. Other requests are served as before. Wrap the project's ASGI
    application with it (`application = stream_threads(get_asgi_application())`). Needs
    asgiref's ThreadSensitiveContext(executor=...) (3.13 has it); without it, nothing
    changes."""
    if not TAKES_EXECUTOR:
        return application
    if not _SHARED:
        _SHARED.extend(
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrun-stream-request")
            for _ in range(SHARED_THREADS)
        )
    turns = itertools.cycle(_SHARED)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and STREAM_PATH.search(scope.get("path", "")):
            async with ThreadSensitiveContext(executor=next(turns)):
                await application(scope, receive, send)
        else:
            await application(scope, receive, send)

    return app


class SyncStream:
    """An async stream as a WSGI server reads a body: a synchronous iterator that runs it,
    chunk by chunk, on an event loop of its own (a WSGI stream holds its worker thread
    anyway). Closed by the server when the client goes away or the stream ends."""

    def __init__(self, body: AsyncIterator[str], lease: Lease) -> None:
        self.body = body
        self.lease = lease
        self.loop: asyncio.AbstractEventLoop | None = None

    def __iter__(self) -> SyncStream:
        return self

    def __next__(self) -> str:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        if self.loop.is_closed():
            raise StopIteration
        try:
            return self.loop.run_until_complete(self.body.__anext__())
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None

    def close(self) -> None:
        if self.loop is None:  # never read: its place is still to be released
            self.loop = asyncio.new_event_loop()
        loop = self.loop
        if loop.is_closed():
            return
        try:
            loop.run_until_complete(self.body.aclose())  # type: ignore[attr-defined]
            loop.run_until_complete(self.lease.release())
            close_checks_on(loop)
            loop.run_until_complete(close_hub())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def close_checks_on(loop: asyncio.AbstractEventLoop) -> None:
    async def close() -> None:
        close_checks()

    loop.run_until_complete(close())
