"""Reading runs' live streams from Redis in async views (`redis.asyncio`), made for many
clients: per event loop one `Hub` reads every watched run's stream with one blocking
`XREAD` on one connection and fans the entries out to each client's queue; a client's own
commands (where the answer being written starts, what it missed) are short ones on a
small shared pool. No connection, thread or blocked read per client; what waits for a
client that does not read is bounded (AGENTRUN_STREAM_BUFFER_ENTRIES: past it the client
is dropped from the hub and told so, with `SlowReader`)."""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Any

from ..conf import agentrun_settings
from .config import attempt_key, redis_url

logger = logging.getLogger(__name__)

Entry = tuple[str, dict[str, Any]]

# The hub's XREAD blocks this long (ms): a run watched for the first time joins the read
# within it. The socket waits longer than that for an answer.
BLOCK_MS = 250
SOCKET_TIMEOUT = 30.0
POOL_SIZE = 20  # connections for the clients' short commands (they wait for a free one)

_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


def client() -> Hub | None:
    """The running loop's hub for the configured Redis, or None (no Redis)."""
    url = redis_url()
    if url is None:
        return None
    per_url = _loops.setdefault(asyncio.get_running_loop(), {})
    found = per_url.get(url)
    if found is None:
        import redis.asyncio

        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_SIZE,
            timeout=5,
            socket_connect_timeout=1.0,
            socket_timeout=SOCKET_TIMEOUT,
        )
        found = per_url[url] = Hub(redis.asyncio.Redis(connection_pool=pool))
    return found


class SlowReader(Exception):
    """The client read too slowly: more entries waited for it than
    AGENTRUN_STREAM_BUFFER_ENTRIES, and the hub stopped keeping them."""


class Inbox:
    """The entries waiting for one client, at most `limit` of them: one more, and they
    are dropped for a SlowReader (the client's stream ends; it reconnects with its cursor)."""

    def __init__(self, limit: int) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.limit = limit
        self.held = 0
        self.overflowed = False

    def put(self, item: Any) -> bool:
        """Queue a batch of entries (or an exception); False once the inbox is full."""
        if self.overflowed:
            return False
        size = len(item) if isinstance(item, list) else 0
        if self.held + size > self.limit:
            self.overflowed = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.held = 0
            self.queue.put_nowait(SlowReader())
            return False
        self.held += size
        self.queue.put_nowait(item)
        return True

    def get_nowait(self) -> Any:
        item = self.queue.get_nowait()
        self.held -= len(item) if isinstance(item, list) else 0
        return item

    async def get(self) -> Any:
        item = await self.queue.get()
        self.held -= len(item) if isinstance(item, list) else 0
        return item

    def empty(self) -> bool:
        return self.queue.empty()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entries(raw: Any) -> list[Entry]:
    out = []
    for entry_id, fields in raw or []:
        data = fields.get(b"d") or fields.get("d")
        try:
            item = json.loads(data)
        except (TypeError, ValueError):
            continue
        out.append((_text(entry_id), item))
    return out


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as something that orders ("1700000000000-3" -> (1700..., 3))."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class Hub:
    """One blocking read of every watched stream for a loop; entries go to subscribers'
    queues (an exception, when Redis fails: the subscribers fall back to the database)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.positions: dict[str, str] = {}
        self.queues: dict[str, set[Inbox]] = {}
        self.task: asyncio.Task[None] | None = None

    def subscribe(self, key: str, after: str) -> tuple[Inbox, str]:
        """An inbox of `key`'s entries from the hub's position on, and that position."""
        queue = Inbox(int(agentrun_settings.STREAM_BUFFER_ENTRIES))
        self.queues.setdefault(key, set()).add(queue)
        position = self.positions.setdefault(key, after)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())
        return queue, position

    def unsubscribe(self, key: str, queue: Inbox) -> None:
        watchers = self.queues.get(key)
        if watchers is not None:
            watchers.discard(queue)
            if not watchers:
                del self.queues[key]
                self.positions.pop(key, None)

    async def _run(self) -> None:
        while self.queues:
            try:
                found = await self.redis.xread(dict(self.positions), count=500, block=BLOCK_MS)
            except Exception as exc:  # noqa: BLE001 - every watcher falls back to the database
                for watchers in self.queues.values():
                    for queue in watchers:
                        queue.put(exc)
                self.queues.clear()
                self.positions.clear()
                return
            for key, raw in found or []:
                key = _text(key)
                entries = _entries(raw)
                if not raw or key not in self.positions:
                    continue
                self.positions[key] = _text(raw[-1][0])
                for queue in list(self.queues.get(key, ())):
                    if not queue.put(entries):
                        self.unsubscribe(key, queue)  # a slow reader: told, then let go


class RunDeltas:
    """One stream client's view of one run's Redis stream, through its loop's hub."""

    def __init__(self, hub: Hub, key: str) -> None:
        self.hub = hub
        self.key = key
        self.last = "0-0"
        self.queue: Inbox | None = None

    async def catch_up(self) -> list[Entry]:
        """The entries from the newest attempt marker on (the answer being written, if any);
        then the hub's entries follow, none missed, none twice."""
        redis = self.hub.redis
        pipe = redis.pipeline(transaction=False)
        pipe.get(attempt_key(self.key))
        pipe.xrevrange(self.key, count=1)
        start, newest = await pipe.execute()
        self.last = _text(newest[0][0]) if newest else "0-0"
        entries = []
        if start and newest:
            entries = _entries(await redis.xrange(self.key, min=_text(start), max=self.last))
        self.queue, position = self.hub.subscribe(self.key, self.last)
        if id_key(position) > id_key(self.last):
            # The hub is ahead: what it sent before this client subscribed, fetched here.
            gap = await redis.xrange(self.key, min=f"({self.last}", max=position)
            entries += _entries(gap)
            self.last = position
        return entries

    async def next(self, timeout: float) -> list[Entry]:
        """Entries that came since, waiting up to `timeout` seconds; raises if Redis failed
        (and SlowReader when more waited for this client than it may hold)."""
        assert self.queue is not None
        try:
            got = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return []
        batches = [got]
        while not self.queue.empty():
            batches.append(self.queue.get_nowait())
        fresh = []
        for batch in batches:
            if isinstance(batch, Exception):
                raise batch
            for entry_id, item in batch:
                if id_key(entry_id) > id_key(self.last):
                    fresh.append((entry_id, item))
                    self.last = entry_id
        return fresh

    def close(self) -> None:
        if self.queue is not None:
            self.hub.unsubscribe(self.key, self.queue)
            self.queue = None


async def close_hub() -> None:
    """Close the running loop's hub and its connections (a loop that ends: a WSGI stream's)."""
    found = _loops.pop(asyncio.get_running_loop(), {})
    for hub in found.values():
        if hub.task is not None:
            hub.task.cancel()
        try:
            await hub.redis.aclose()
            await hub.redis.connection_pool.disconnect()
        except Exception as exc:  # noqa: BLE001 - closing what is gone anyway
            logger.debug("Closing a stream hub: %s", exc)
