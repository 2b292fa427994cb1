"""Connections to MCP servers, one set per process, through the official `mcp` SDK.

The SDK is asyncio; the engine is not. Each process runs one event loop in a daemon thread
(made lazily, after any fork: a Celery prefork child makes its own, keyed by pid) and hands
it coroutines (`asyncio.run_coroutine_threadsafe`). A connection is held open by one task of
that loop (the SDK's transports and sessions are entered and left in the same task) and
kept for the life of the process: a stdio server is started once per process, an HTTP
session once per server and set of headers (one per owner when the headers are a user's).

Before each call the session is pinged: a stdio server that died is started again, an HTTP
session that expired is opened again, and the call is sent only on a live session. A
connection lost while a call was out is an unknown outcome (`ToolOutcomeUnknown`): nothing
is recorded and the call's side-effect class decides, as after a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..abort import AbortSignal
from ..exceptions import (
    ConfigurationError,
    MCPUnavailable,
    ToolCancelled,
    ToolError,
    ToolOutcomeUnknown,
)
from . import http
from .servers import MCPServer

logger = logging.getLogger(__name__)

PING_SECONDS = 5.0  # at most, for the liveness check before a call
_ABORT_POLL = 0.1  # seconds between two looks at the abort signal while a call is out

Progress = Callable[[float, float | None, str | None], None]


def sdk() -> Any:
    """The `mcp` package, or ConfigurationError saying how to install it."""
    try:
        import mcp  # noqa: PLC0415 - optional: only a project with MCP servers needs it
    except ImportError as exc:
        raise ConfigurationError(
            "MCP servers need the mcp package: pip install 'django-agentrun[mcp]'"
        ) from exc
    return mcp


class _Loop:
    """This process's event loop, in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="agentrun-mcp", daemon=True)
        self.thread.start()
        ready.wait()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_loops: dict[int, _Loop] = {}
_connections: dict[tuple[int, str, tuple[tuple[str, str], ...]], Connection] = {}
_lock = threading.Lock()


def _loop() -> _Loop:
    http.hide_queries()  # httpx2 logs each request's URL at INFO
    pid = os.getpid()
    with _lock:
        found = _loops.get(pid)
        if found is None:
            _loops.clear()  # a parent's, inherited by fork: its thread is not here
            _connections.clear()
            found = _loops[pid] = _Loop()
        return found


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


class Connection:
    """One session with one server (and one set of headers), held by a task of the loop."""

    def __init__(self, server: MCPServer, headers: dict[str, str]) -> None:
        self.server = server
        self.headers = headers
        self.session: Any = None
        self._holder: asyncio.Task | None = None
        self._close: asyncio.Event | None = None
        self._opening: asyncio.Lock | None = None
        self.opened = 0  # how many times a session was opened (a restart counts)

    async def live(self) -> Any:
        """A session known to answer: the current one if a ping gets through, else a new one."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self.session is not None and self._holder is not None and not self._holder.done():
                try:
                    await asyncio.wait_for(self.session.send_ping(), PING_SECONDS)
                    return self.session
                except Exception:  # noqa: BLE001 - dead or wedged: open another
                    logger.info(
                        "MCP server %s did not answer a ping; reconnecting", self.server.name
                    )
                    await self.close()
            return await self._open()

    async def _open(self) -> Any:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._close = asyncio.Event()
        self._holder = asyncio.ensure_future(self._hold(ready, self._close))
        try:
            self.session = await asyncio.wait_for(
                asyncio.shield(ready), self.server.connect_timeout
            )
        except BaseException:
            self._close.set()
            self._holder.cancel()
            raise
        self.opened += 1
        return self.session

    async def _hold(self, ready: asyncio.Future, close: asyncio.Event) -> None:
        """Enter the transport and the session, initialize, then keep them until closed."""
        from contextlib import AsyncExitStack  # noqa: PLC0415

        try:
            mcp = sdk()
            async with AsyncExitStack() as stack:
                if self.server.transport == "stdio":
                    params = mcp.StdioServerParameters(
                        command=self.server.command,
                        args=list(self.server.args),
                        env=self.server.env_now(),
                        cwd=self.server.cwd,
                    )
                    streams = await stack.enter_async_context(mcp.stdio_client(params, _errlog()))
                else:
                    from mcp.client.streamable_http import (  # noqa: PLC0415
                        streamable_http_client,
                    )

                    # Checked and pinned when the server is public_only (http.py).
                    client, url = http.client(self.server, self.headers)
                    await stack.enter_async_context(client)
                    streams = await stack.enter_async_context(
                        streamable_http_client(url, http_client=client)
                    )
                read, write = streams[0], streams[1]
                # No session-wide read timeout: the open is bounded by connect_timeout, each
                # call by the server's timeout.
                session = await stack.enter_async_context(mcp.ClientSession(read, write))
                await session.initialize()
                ready.set_result(session)
                await close.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(exc))
            if not isinstance(exc, Exception):
                raise
            logger.info(
                "MCP server %s: session ended (%s)",
                self.server.name,
                http.without_queries(repr(exc)),
            )

    async def close(self) -> None:
        if self._close is not None:
            self._close.set()
        holder, self._holder, self.session = self._holder, None, None
        if holder is not None:
            try:
                await asyncio.wait_for(holder, 5)
            except BaseException:  # noqa: BLE001 - closing: whatever it ended with
                holder.cancel()


def _errlog() -> Any:
    """Where a stdio server's stderr goes: this process's (Celery replaces sys.stderr with
    a proxy that has no file descriptor; the server needs one)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
            return stream
        except (AttributeError, OSError, ValueError):
            continue
    return open(os.devnull, "w")  # noqa: SIM115 - for the life of the process


def connection(server: MCPServer, headers: dict[str, str]) -> tuple[_Loop, Connection]:
    loop = _loop()
    key = (os.getpid(), server.name, tuple(sorted(headers.items())))
    with _lock:
        found = _connections.get(key)
        if found is not None and found.server != server:  # redefined: close the old one
            loop.submit(found.close())
            found = None
        if found is None:
            found = _connections[key] = Connection(server, headers)
    return loop, found


def list_tools(server: MCPServer, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The server's tools (every page), in MCP's wire form (camelCase keys)."""
    sdk()  # ConfigurationError, at once, without the package
    loop, conn = connection(server, headers)

    async def listed() -> list[dict[str, Any]]:
        session = await conn.live()
        tools: list[dict[str, Any]] = []
        cursor = None
        for _ in range(100):  # a paginator that never ends cannot hang a run's start
            params = None
            if cursor is not None:
                params = sdk().types.PaginatedRequestParams(cursor=cursor)
            page = await session.list_tools(params=params)
            tools.extend(
                t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools
            )
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    try:
        wait = server.connect_timeout + server.timeout + PING_SECONDS
        return loop.submit(listed()).result(timeout=wait)
    except Exception as exc:
        # The detail to the log (URLs without their query strings); the client is told which
        # server, not what a connection error says about the network behind it.
        logger.warning(
            "MCP server %s: cannot list its tools (%s)",
            server.name,
            http.without_queries(repr(exc)),
        )
        raise MCPUnavailable(
            f"MCP server {server.name} could not be reached to list its tools: nothing was "
            "started; try again later."
        ) from exc


def call_tool(
    server: MCPServer,
    headers: dict[str, str],
    name: str,
    arguments: dict[str, Any],
    *,
    meta: dict[str, Any],
    abort: AbortSignal,
    on_progress: Progress | None = None,
    timeout_is_an_answer: bool = False,
) -> dict[str, Any]:
    """`tools/call` on a live session: its result in MCP's wire form. While it is out, a
    cancel (`abort`) cancels the request (the SDK sends `notifications/cancelled`) and
    raises ToolCancelled; a lost connection raises ToolOutcomeUnknown (the server may or may
    not have acted), and so does the server's timeout, unless `timeout_is_an_answer` (a
    call safe to make again: the model is told it timed out, a ToolError)."""
    loop, conn = connection(server, headers)
    state = CallState()
    mcp = sdk()

    # Progress is handed to this (the handler's) thread: its heartbeat writes through this
    # thread's database connection, and a failpoint fires where the handler runs.
    ticks: queue.SimpleQueue = queue.SimpleQueue()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        ticks.put((value, total, message))

    def drain() -> None:
        while on_progress is not None and not ticks.empty():
            on_progress(*ticks.get_nowait())

    async def call() -> dict[str, Any]:
        try:
            session = await conn.live()
            state.sending()
            result = await session.call_tool(
                name,
                arguments,
                read_timeout_seconds=server.timeout,
                progress_callback=progress if on_progress is not None else None,
                meta=meta,
            )
            return result.model_dump(by_alias=True, mode="json", exclude_none=True)
        finally:
            state.finished.set()

    future = loop.submit(call())
    if not wait_for(future, state, abort, drain):
        raise ToolCancelled(f"MCP tool {name} on {server.name} cancelled: {abort.reason}")
    drain()
    if future.cancelled():
        raise ToolCancelled(f"MCP tool {name} on {server.name} cancelled")
    exc = future.exception()
    if exc is None:
        return future.result()
    if not state.sent:  # the session never answered a ping: nothing was sent
        raise ToolError(
            f"MCP server {server.name} is unavailable: {http.without_queries(repr(exc))}"
        ) from exc
    if isinstance(exc, mcp.MCPError):
        code = getattr(exc.error, "code", None)
        if timeout_is_an_answer and code == _REQUEST_TIMEOUT:
            # The SDK cancelled the request (notifications/cancelled) when it gave up.
            raise ToolError(
                f"MCP tool {name} on {server.name} did not answer within {server.timeout:g} s."
            ) from exc
        if code in _REFUSALS:
            # JSON-RPC's own errors about the request (parse, invalid request, method not
            # found, invalid params): the server answered without running the tool.
            raise ToolError(f"MCP server {server.name} refused the call: {exc}") from exc
    raise ToolOutcomeUnknown(
        f"MCP tool {name} on {server.name}: no answer ({http.without_queries(repr(exc))}); "
        "it may have run"
    ) from exc


_REQUEST_TIMEOUT = -32001  # the SDK's code for a request it stopped waiting for
_REFUSALS = (-32700, -32600, -32601, -32602)


CANCEL_SENT_SECONDS = 2.0  # at most this long for the SDK to send notifications/cancelled


class CallState:
    """Where a call's coroutine is, as the handler's thread sees it: whether its request was
    sent (then a cancel must reach the server), and when the coroutine has ended (after the
    SDK sent notifications/cancelled, for a cancelled one). One lock decides whether a
    cancel or the sending comes first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.sent = False
        self.finished = threading.Event()

    def sending(self) -> None:
        """In the coroutine, before the request goes: not once a cancel came first."""
        with self.lock:
            if self.cancelled:
                raise asyncio.CancelledError
            self.sent = True

    def cancel(self, future: concurrent.futures.Future) -> bool:
        """Cancel the call: False when it had ended first (its answer counts). Returns once
        the cancellation was sent (the coroutine ended: the SDK sends
        notifications/cancelled as it unwinds), or nothing was sent, or CANCEL_SENT_SECONDS
        passed."""
        with self.lock:
            self.cancelled = True
            sent = self.sent
        if not future.cancel():
            return False
        if sent:
            self.finished.wait(CANCEL_SENT_SECONDS)
        return True


def wait_for(
    future: concurrent.futures.Future,
    state: CallState,
    abort: AbortSignal,
    drain: Callable[[], None],
) -> bool:
    """Wait for a call's future, handing its progress on (`drain`): True when it ended (its
    result or error is in it), False when a cancel stopped it first. Its own TimeoutError (a
    session that did not open in time) is not taken for "not done yet": the future says."""
    while not concurrent.futures.wait([future], timeout=_ABORT_POLL).done:
        drain()
        if abort.aborted and state.cancel(future):
            return False
    return True


def close_all(seconds: float = 5.0) -> None:
    """Close this process's sessions (stdio servers stop): tests, a clean shutdown."""
    pid = os.getpid()
    loop = _loops.get(pid)
    if loop is None:
        return
    with _lock:
        conns = [c for k, c in _connections.items() if k[0] == pid]
        for key in [k for k in _connections if k[0] == pid]:
            del _connections[key]

    async def closing() -> None:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    try:
        loop.submit(closing()).result(timeout=seconds)
    except Exception:  # noqa: BLE001 - best effort
        logger.debug("MCP connections did not all close", exc_info=True)
