"""Publishing to live streams without ever slowing a turn down: the model's deltas and the
nudges sent after each commit go into a bounded in-memory queue, and one background
thread per process writes them to Redis Streams (`XADD ... MAXLEN ~`, with an expiry),
coalescing consecutive deltas of one block into one entry.

Nothing here is durable: a full queue drops deltas, a Redis error drops the batch (both
logged, at most once a minute), and without Redis it is all a no-op. The durable events in
the database stay the record; a stream reads them on each nudge (and on a timer).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..conf import agentrun_settings
from .config import attempt_key, keys_of, redis_url

logger = logging.getLogger(__name__)

# Deltas whose text fields consecutive entries of one block may be joined on.
_JOINABLE = {"text": "text", "thinking": "thinking", "input_json": "partial_json"}
_BATCH = 500  # items per pipeline at most
_LOG_EVERY = 60.0  # seconds between two warnings about dropped deltas


class Publisher:
    """One process's queue and thread for one Redis URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(
            maxsize=int(agentrun_settings.STREAM_QUEUE_SIZE)
        )
        self.dropped = 0
        self.published = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned = 0.0
        self._client: Any = None

    def put(self, key: str, item: dict[str, Any]) -> None:
        """Queue `item` for `key`'s stream; never blocks (a full queue drops it)."""
        try:
            self.queue.put_nowait((key, item))
        except queue.Full:
            self.dropped += 1
            self._warn("Live stream queue full: deltas dropped (%s so far)", self.dropped)
        if self._thread is None:
            self._start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the queue is written (tests, benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentrun-stream-publisher", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < _BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(coalesce(batch))
            except Exception as exc:  # noqa: BLE001 - Redis down or refusing: drop, go on
                self.dropped += len(batch)
                self._client = None
                self._warn("Live stream publishing failed (%s): %s", type(exc).__name__, exc)
            finally:
                for _ in batch:
                    self.queue.task_done()

    def _write(self, entries: list[tuple[str, dict[str, Any]]]) -> None:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_timeout=2.0, socket_connect_timeout=1.0
            )
        maxlen = int(agentrun_settings.STREAM_MAXLEN)
        ttl = int(agentrun_settings.STREAM_TTL_SECONDS)
        pipe = self._client.pipeline(transaction=False)
        for key, item in entries:
            pipe.xadd(key, {"d": json.dumps(item, separators=(",", ":"))}, maxlen=maxlen)
        for key in {key for key, _ in entries}:
            pipe.expire(key, ttl)
        ids = pipe.execute()[: len(entries)]
        markers = [
            (attempt_key(key), entry_id)
            for (key, item), entry_id in zip(entries, ids, strict=True)
            if item.get("kind") == "attempt"
        ]
        if markers:
            pipe = self._client.pipeline(transaction=False)
            for key, entry_id in markers:
                pipe.set(key, entry_id, ex=ttl)
            pipe.execute()
        self.published += len(entries)

    def _warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._warned >= _LOG_EVERY:
            self._warned = now
            logger.warning(message, *args)


def coalesce(batch: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Join consecutive deltas of one block (same key, turn, attempt, index and kind)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for key, item in batch:
        field = _JOINABLE.get(item.get("kind", ""))
        if field and out:
            last_key, last = out[-1]
            if last_key == key and all(
                last.get(k) == item.get(k) for k in ("kind", "turn", "attempt", "index", "position")
            ):
                out[-1] = (key, {**last, field: last[field] + item[field]})
                continue
        out.append((key, dict(item)))
    return out


_publishers: dict[str, Publisher] = {}
_publishers_lock = threading.Lock()


def publisher() -> Publisher | None:
    """This process's publisher for the configured Redis, or None (no Redis)."""
    url = redis_url()
    if url is None:
        return None
    found = _publishers.get(url)
    if found is None:
        with _publishers_lock:
            found = _publishers.setdefault(url, Publisher(url))
    return found


def _forget_after_fork() -> None:
    # A forked child (a prefork pool process) has the queue but not the thread.
    global _publishers_lock
    _publishers.clear()
    _publishers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def notify(run: Any, seq: int) -> None:
    """A commit of `run` (a Run, or its id) made its events durable up to `seq`: wake its
    streams' readers (the run's, and its conversation's)."""
    pub = publisher()
    if pub is not None:
        for key, tags in keys_of(run):
            pub.put(key, {"kind": "commit", "seq": seq, **tags})


def progress(run: Any, item: dict[str, Any]) -> None:
    """A tool call's progress tick (an MCP progress notification) on `run`'s live streams
    (`kind` tool_progress): ephemeral, as deltas are; the call's result is the record."""
    pub = publisher()
    if pub is not None:
        for key, tags in keys_of(run):
            pub.put(key, {"kind": "tool_progress", **item, **tags})


class TurnStream:
    """Where the deltas of one turn's answer go: `attempt(n)` marks the start of a model
    attempt (a retry, or another worker asking again after a crash, starts the turn's
    deltas over) and returns the sink for its deltas."""

    def __init__(self, pub: Publisher, run: Any, turn: int) -> None:
        self._pub = pub
        self._keys = keys_of(run)
        self._turn = turn

    def attempt(self, number: int) -> Callable[[dict[str, Any]], None]:
        pub, turn = self._pub, self._turn
        marked = {"turn": turn, "attempt": number, "attempt_id": uuid.uuid4().hex[:12]}
        for key, tags in self._keys:
            pub.put(key, {"kind": "attempt", **marked, **tags})
        sinks = [(key, {"turn": turn, "attempt": number, **tags}) for key, tags in self._keys]

        def on_event(delta: dict[str, Any]) -> None:
            for key, tags in sinks:
                pub.put(key, {**delta, **tags})

        return on_event


def turn_stream(run: Any, turn: int) -> TurnStream | None:
    """The stream of `turn`'s deltas (of `run`: a Run, or its id), or None when there is
    nowhere to publish them."""
    pub = publisher()
    return TurnStream(pub, run, turn) if pub is not None else None
