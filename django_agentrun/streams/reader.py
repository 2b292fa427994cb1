"""Reading runs' live streams from Redis in async views (`redis.asyncio`), made for many
watchers: per event loop (one per uvicorn process) one `Hub` reads every watched run's
(and conversation's) stream with one blocking `XREAD` on one connection, decodes each entry
once, and fans it out to every watcher of that stream through the watcher's own bounded
`Inbox`. A watcher's own commands (where the answer being written starts, what it missed)
are short ones on a small shared pool. No connection, thread, task or blocked read per
watcher; what waits for a watcher that does not read is bounded
(AGENTRUN_STREAM_BUFFER_ENTRIES: past it the watcher is dropped from the hub and told so,
with `SlowReader`, and the others never wait for it).

The hub outlives Redis errors: a failed read tells every watcher (`Gap`: read the
database, deltas may have been missed), then the hub reads again after a pause (0.1 s,
doubling up to 2 s) from where it was; a Redis that restarted empty is read from its new
entries. The last watcher of a stream leaving stops the reading of that stream; the last
of all ends the loop (a new watcher starts it again). `close_hub()` ends it for good (a
loop that ends)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import deque
from typing import Any

from ..conf import agentrun_settings
from .config import attempt_key, redis_url

logger = logging.getLogger(__name__)

Entry = tuple[str, dict[str, Any]]

# The hub's XREAD blocks this long (ms): a run watched for the first time joins the read
# within it. The socket waits longer than that for an answer.
BLOCK_MS = 250
SOCKET_TIMEOUT = 30.0
POOL_SIZE = 20  # connections for the watchers' short commands (they wait for a free one)
RETRY_FIRST, RETRY_MOST = 0.1, 2.0  # seconds between the hub's reads while Redis fails

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
    """The watcher read too slowly: more entries waited for it than
    AGENTRUN_STREAM_BUFFER_ENTRIES, and the hub stopped keeping them."""


class Gap(Exception):
    """The hub could not read Redis for a while: deltas may have been missed (the
    database holds what was committed meanwhile). The watcher stays on the hub."""


class Revoked(Exception):
    """The watcher's user may no longer see what it watches (its periodic check)."""


class Inbox:
    """What waits for one watcher: batches of entries (lists shared by every watcher of a
    stream: never changed), and signals (an exception to raise: `Gap`, `Revoked`,
    `SlowReader`), at most `limit` entries: one more, and the entries are dropped for a
    SlowReader (the stream ends; its client reconnects with its cursor). One waiter at a
    time, woken without a task of its own."""

    __slots__ = ("items", "limit", "held", "overflowed", "_waiter", "_timer")

    def __init__(self, limit: int) -> None:
        self.items: deque[Any] = deque()
        self.limit = limit
        self.held = 0
        self.overflowed = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def put(self, item: Any) -> bool:
        """Queue a batch of entries (or a signal); False once the inbox overflowed."""
        if self.overflowed:
            return False
        if isinstance(item, list):
            if self.held + len(item) > self.limit:
                self.overflowed = True
                self.items.clear()
                self.held = 0
                self.items.append(SlowReader())
                self._wake()
                return False
            self.held += len(item)
        self.items.append(item)
        self._wake()
        return True

    def signal(self, exc: Exception) -> None:
        """A signal that is not dropped: a revocation reaches even a full inbox (the same
        signal twice in a row is kept once: a watcher that does not read holds few)."""
        if not (self.items and type(self.items[-1]) is type(exc)):
            self.items.append(exc)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self.items

    def get_nowait(self) -> Any:
        item = self.items.popleft()
        if isinstance(item, list):
            self.held -= len(item)
        return item

    async def get(self) -> Any:
        while not self.items:
            await self.wait(3600.0)
        return self.get_nowait()

    async def wait(self, timeout: float) -> None:
        """Until something is queued or at most `timeout` seconds passed (maybe sooner: a
        timer set for an earlier wait that is still to come is kept, not made anew for each
        wait: a watcher that gets 50 deltas a second sets a timer once per timeout)."""
        if self.items:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, timeout)
        timer = self._timer
        if timer is None or timer.when() > when:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(when, self._on_timer)
        waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        self._timer = None
        self._wake()

    def close(self) -> None:
        """No more waits: its timer goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def drain(self) -> list[Any]:
        items = list(self.items)
        self.items.clear()
        self.held = 0
        return items


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Item(dict):  # type: ignore[type-arg]
    """An entry's data as a dict, decoded once for all the watchers of its stream; `framed`
    keeps what a format made of it (the same frame for every watcher: encoded once)."""

    __slots__ = ("framed",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.framed: str | None = None


def _entries(raw: Any) -> list[Entry]:
    out = []
    for entry_id, fields in raw or []:
        data = fields.get(b"d") or fields.get("d")
        try:
            item = json.loads(data)
        except (TypeError, ValueError):
            continue
        if isinstance(item, dict):
            out.append((_text(entry_id), Item(item)))
    return out


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as something that orders ("1700000000000-3" -> (1700..., 3))."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class Hub:
    """One blocking read of every watched stream for a loop; each entry decoded once and
    queued for every watcher of its stream. Redis errors pause it, never end it."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.positions: dict[str, str] = {}
        self.queues: dict[str, set[Inbox]] = {}
        self.task: asyncio.Task[None] | None = None
        self.down = False  # the last read failed: watchers read the database meanwhile
        self.reads = 0  # XREADs answered (tests, diagnostics)
        self.closed = False

    def subscribe(self, key: str, after: str, inbox: Inbox | None = None) -> tuple[Inbox, str]:
        """`inbox` (a new one by default) fed with `key`'s entries from the hub's position
        on, and that position."""
        if inbox is None:
            inbox = Inbox(int(agentrun_settings.STREAM_BUFFER_ENTRIES))
        self.queues.setdefault(key, set()).add(inbox)
        position = self.positions.setdefault(key, after)
        task = self.task
        if not self.closed and (task is None or task.done() or task.cancelling()):
            self.task = asyncio.ensure_future(self._run())
        return inbox, position

    def unsubscribe(self, key: str, inbox: Inbox) -> None:
        watchers = self.queues.get(key)
        if watchers is not None:
            watchers.discard(inbox)
            if not watchers:
                del self.queues[key]
                self.positions.pop(key, None)
                if not self.queues and self.task is not None and not self.task.done():
                    # The last watcher left: stop reading now, not after the read's block
                    # (a process shutting down has nothing pending left behind).
                    self.task.cancel()

    def watchers(self) -> int:
        return sum(len(found) for found in self.queues.values())

    async def _run(self) -> None:
        pause = RETRY_FIRST
        while self.queues and not self.closed:
            try:
                found = await self.redis.xread(dict(self.positions), count=500, block=BLOCK_MS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - tell the watchers, read again later
                if not self.down:
                    logger.warning("Live streams: Redis read failed (%s), retrying", exc)
                    self.down = True
                    self._tell_all(Gap())  # once: they poll the database while it is down
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MOST)
                continue
            self.reads += 1
            if self.down:
                self.down = False
                pause = RETRY_FIRST
                logger.warning("Live streams: Redis read again")
                self._tell_all(Gap())  # what came meanwhile is in the database
            for key, raw in found or []:
                key = _text(key)
                if not raw or key not in self.positions:
                    continue
                self.positions[key] = _text(raw[-1][0])
                entries = _entries(raw)
                for inbox in list(self.queues.get(key, ())):
                    if not inbox.put(entries):
                        self.unsubscribe(key, inbox)  # a slow reader: told, then let go

    def _tell_all(self, signal: Exception) -> None:
        for watchers in self.queues.values():
            for inbox in watchers:
                inbox.signal(signal)


class RunDeltas:
    """One watcher's view of one run's (or conversation's) Redis stream, through its loop's
    hub; `inbox` also carries the watcher's other signals (`Revoked`)."""

    def __init__(self, hub: Hub, key: str, inbox: Inbox | None = None) -> None:
        self.hub = hub
        self.key = key
        self.last = "0-0"
        self.inbox = inbox or Inbox(int(agentrun_settings.STREAM_BUFFER_ENTRIES))
        self.queue: Inbox | None = None  # the inbox, while subscribed

    async def catch_up(self) -> list[Entry]:
        """The entries from the newest attempt marker on (the answer being written, if any);
        then the hub's entries follow, none missed, none twice. Redis not answering: no
        entries, and the hub's from now on (what it missed meanwhile is in the database)."""
        redis = self.hub.redis
        try:
            pipe = redis.pipeline(transaction=False)
            pipe.get(attempt_key(self.key))
            pipe.xrevrange(self.key, count=1)
            start, newest = await pipe.execute()
            self.last = _text(newest[0][0]) if newest else "0-0"
            entries = []
            if start and newest:
                entries = _entries(await redis.xrange(self.key, min=_text(start), max=self.last))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the hub retries; the database meanwhile
            logger.warning("Live stream caught up without Redis (%s) key=%s", exc, self.key)
            self.last = f"{int(time.time() * 1000)}-0"
            self.queue, _ = self.hub.subscribe(self.key, self.last, self.inbox)
            self.inbox.signal(Gap())
            return []
        self.queue, position = self.hub.subscribe(self.key, self.last, self.inbox)
        if id_key(position) > id_key(self.last):
            # The hub is ahead: what it sent before this watcher subscribed, fetched here.
            try:
                gap = await redis.xrange(self.key, min=f"({self.last}", max=position)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - missed: the database has what was committed
                gap = []
                self.inbox.signal(Gap())
            entries += _entries(gap)
            self.last = position
        return entries

    async def next(self, timeout: float) -> list[Entry]:
        """Entries that came since, waiting up to `timeout` seconds; raises a signal that
        came (`Gap`, `Revoked`, `SlowReader`) after the entries before it were taken."""
        await self.inbox.wait(timeout)
        return self.take()

    def take(self) -> list[Entry]:
        fresh: list[Entry] = []
        inbox = self.inbox
        while inbox.items:
            batch = inbox.items[0]
            if not isinstance(batch, list):
                if fresh:
                    return fresh  # the signal is raised on the next call
                inbox.items.popleft()
                raise batch
            inbox.get_nowait()
            if not batch:
                continue
            last = id_key(self.last)
            if id_key(batch[0][0]) > last:  # the common case: all of it is new
                fresh.extend(batch)
                self.last = batch[-1][0]
                continue
            for entry_id, item in batch:
                at = id_key(entry_id)
                if at > last:
                    fresh.append((entry_id, item))
                    last = at
                    self.last = entry_id
        return fresh

    def close(self) -> None:
        self.inbox.close()
        if self.queue is not None:
            self.hub.unsubscribe(self.key, self.queue)
            self.queue = None


async def close_hub() -> None:
    """Close the running loop's hub and its connections (a loop that ends: a WSGI stream's,
    a process that shuts down)."""
    found = _loops.pop(asyncio.get_running_loop(), {})
    for hub in found.values():
        hub.closed = True
        if hub.task is not None and not hub.task.done():
            hub.task.cancel()
            try:
                await hub.task
            except BaseException:  # noqa: BLE001, S110 - cancelled, or failed: it ends either way
                pass
        try:
            await hub.redis.aclose()
            await hub.redis.connection_pool.disconnect()
        except Exception as exc:  # noqa: BLE001 - closing what is gone anyway
            logger.debug("Closing a stream hub: %s", exc)
