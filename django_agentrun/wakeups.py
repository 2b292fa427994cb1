"""Waking a worker for a run: the one place that publishes `advance_run`, and the one
place that asks the broker which wake-ups are still waiting or on their way.

A message is only a wake-up call (the engine decides from the database), so a lost one
costs time, not correctness: the reaper re-sends it. It must neither wait long for that
nor pile duplicates onto runs whose wake-up is merely slow: waiting behind others in a busy
queue, held by a busy worker, or still to be published by the process that committed a
thousand runs at once. So it asks the broker first (`waiting_runs`), on Redis by the
broker's own clock, never a worker's.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
import uuid
import weakref
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction

from .conf import agentrun_settings
from .failpoints import failpoint

logger = logging.getLogger(__name__)

TASK = "django_agentrun.advance_run"
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
# The countdown of a delayed wake-up, in seconds, as a header of its own: Celery's `eta` is
# the publisher's clock, which may be far off the broker's (a clock that jumped).
COUNTDOWN_HEADER = "agentrun_countdown"
# Beside kombu's keys, in the broker's Redis database: the wake-ups a commit announced before
# publishing them (one set per commit, expiring unless its publisher makes progress; their
# keys in the index set COMING), and when the reaper of a queue first saw each message a
# worker took or that carries a countdown (a hash per queue, `SEEN:<queue>`: delivery tag ->
# the broker's time).
COMING = "agentrun:wakeups:coming"
SEEN = "agentrun:wakeups:seen"


_task: Any = None


def register(task: Any) -> None:
    """The advance_run task (tasks.py registers it when the app is ready: this module
    sits below the Celery surface and does not import it)."""
    global _task
    _task = task


def send(run_id: Any, countdown: float | None = None) -> None:
    """Publish advance_run(run_id) now; a broker error is logged, not raised (the reaper
    re-sends wake-ups that never arrived)."""
    failpoint("turn.before_enqueue")
    options: dict[str, Any] = {}
    if agentrun_settings.QUEUE:
        options["queue"] = agentrun_settings.QUEUE
    if countdown:
        options["countdown"] = countdown
        options["headers"] = {COUNTDOWN_HEADER: float(countdown)}
    try:
        if _task is None:
            raise RuntimeError("django_agentrun's tasks are not loaded (AppConfig.ready)")
        _task.apply_async(args=[str(run_id)], **options)
    except Exception:  # broker down: the reaper re-enqueues runs nobody advances
        logger.exception("Could not enqueue advance_run run_id=%s", run_id)


# --------------------------------------------------------------------------- after a commit


_batches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def on_commit(run_id: Any) -> None:
    """Publish advance_run(run_id) once the current transaction commits (at once outside
    one). When one commit wakes several runs, the broker is told first which wake-ups are
    on their way (`_Batch`): publishing a thousand of them takes a while, and meanwhile the
    reaper must not take a run whose wake-up is merely still to come for a lost one."""
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        send(run_id)
        return
    batch = _batches.get(connection)
    if batch is None or not batch.current(connection):
        batch = _batches[connection] = _Batch(connection)
    batch.ids.append(str(run_id))
    # robust: one callback's error is logged and never skips the rest (as all after-commit
    # work: the signals, the outbox's dispatch, the stream nudge).
    transaction.on_commit(partial(batch.send, str(run_id)), robust=True)


# An announcement expires this long (or a lease, if longer) after its publisher last made
# progress: a publisher on a saturated machine stalls for seconds between two publishes
# (one publish took 2.4 s in bench-load beside two busy loops, and an announcement that
# lived a 3 s lease lapsed: 236 runs re-sent), while a publisher that dies in the middle of
# a commit's wake-ups is rare, and its runs then wait this long for the reaper.
ANNOUNCEMENT_MIN_SECONDS = 30.0


class _Batch:
    """The wake-ups one transaction publishes after its commit. Its first callback, made
    before any of theirs (so it runs first), announces them all to the broker when there are
    several: a Redis set that expires (`_ttl_ms`) unless touched, listed in COMING. The
    wake-ups sent keep it alive (those still to come announced again, should a stall have
    let it lapse); the last one withdraws it. A publisher that dies leaves it to expire
    (Redis's clock), and the reaper re-sends what was never published. Nothing is sent to
    the broker inside the transaction: the instant between the commit and this first
    callback is the reaper's second look's to cover."""

    def __init__(self, connection: Any) -> None:
        self.ids: list[str] = []
        self.key: str | None = None
        self.touched = 0.0
        self.sent = 0
        self.index = len(connection.run_on_commit)  # where its first callback sits
        transaction.on_commit(self.committed, robust=True)

    def current(self, connection: Any) -> bool:
        """Whether this batch belongs to the connection's transaction still (not to one
        that ended, nor cut by a savepoint's rollback)."""
        hooks = connection.run_on_commit
        return self.index < len(hooks) and hooks[self.index][1] == self.committed

    def committed(self) -> None:
        if len(self.ids) < 2:  # one wake-up: nothing to wait for but its own publish
            return
        key = f"{COMING}:{uuid.uuid4().hex}"
        if self._announce(key, self.ids):
            self.key = key

    def _announce(self, key: str, ids: list[str]) -> bool:
        def announce(client: Any) -> None:
            pipe = client.pipeline(transaction=True)
            pipe.sadd(key, *ids).pexpire(key, _ttl_ms()).sadd(COMING, key).execute()

        if _on_broker(announce):
            self.touched = time.monotonic()
            return True
        return False

    def send(self, run_id: str) -> None:
        key = self.key
        if key is not None and time.monotonic() - self.touched > _ttl_ms() / 6000:
            self._announce(key, self.ids[self.sent :])  # in the order they go out
        send(run_id)
        self.sent += 1
        if key is not None and self.sent == len(self.ids):
            _on_broker(lambda client: client.pipeline().delete(key).srem(COMING, key).execute())


def _ttl_ms() -> int:
    return int(max(agentrun_settings.LEASE_SECONDS, ANNOUNCEMENT_MIN_SECONDS, 1.0) * 1000)


def _on_broker(act: Any) -> bool:
    """`act(client)` on the broker's Redis, through the app's connection pool; whether it
    was done (not on another broker, nor when it fails: an announcement is advice, never a
    reason not to publish)."""
    from celery import current_app

    try:
        with current_app.pool.acquire(block=True) as conn:
            conn.ensure_connection(max_retries=0)  # a broker down: at once, not after retries
            channel = conn.default_channel
            if not hasattr(channel, "unacked_key"):
                return False
            with channel.conn_or_acquire() as client:
                act(client)
        return True
    except Exception:  # noqa: BLE001 - the reaper falls back to the wake-ups it can see
        logger.warning("Could not announce wake-ups to the broker", exc_info=True)
        return False


# --------------------------------------------------------------------------- the broker's view


def queue_name() -> str:
    """The queue advance_run messages go to (AGENTRUN_QUEUE, else Celery's routing)."""
    if agentrun_settings.QUEUE:
        return agentrun_settings.QUEUE
    from celery import current_app

    route = current_app.amqp.router.route({}, TASK, (), {})
    queue = route.get("queue")
    return getattr(queue, "name", None) or current_app.conf.task_default_queue


def queued_messages() -> int | None:
    """Messages waiting in advance_run's queue, or None when the broker cannot tell."""
    from amqp.exceptions import ChannelError
    from celery import current_app

    name = queue_name()
    try:
        with current_app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=0)
            try:
                return int(conn.default_channel.queue_declare(queue=name, passive=True)[1])
            except ChannelError as exc:
                # Redis has no empty queues (no key), AMQP none that was never declared.
                if getattr(exc, "code", None) == 404 or "NOT_FOUND" in str(exc):
                    return 0
                raise
    except Exception:  # noqa: BLE001 - an unanswerable broker is "cannot tell"
        logger.debug("Could not count the messages in queue %s", name, exc_info=True)
        return None


def waiting_runs() -> set[str] | None:
    """The runs whose wake-up the broker holds for advance_run's queue, or None when it
    cannot tell (not Redis, more than AGENTRUN_WAKEUP_SCAN_LIMIT messages, an error).

    Held means: announced by a commit still publishing its wake-ups; waiting in the queue
    (at any priority); delivered to a worker and not yet acknowledged (kombu's `unacked`
    hash) less than a lease ago; or with a countdown still to run. A delivered message
    older than that belongs to a worker that died with it (kombu restores it only after its
    visibility timeout, an hour by default): it is not counted. Ages are the broker's clock
    (Redis `TIME`): a delivery counts as old once kombu's time of it (the worker's clock) or
    the reaper's first sight of it (`SEEN`) is a lease ago, so that a worker whose clock runs
    ahead cannot keep a dead message fresh (one whose clock runs behind can make a live one
    look old for the moment before its claim: a duplicate wake-up at worst, which the
    second look and the row lock make rare). The queue and the deliveries are read in one
    MULTI/EXEC, a consistent snapshot, after the announcements; a message is in neither
    place only for the instant between a worker's BRPOP and its bookkeeping, which the
    reaper covers by looking twice (reaper._lost_wakeups)."""
    limit = agentrun_settings.WAKEUP_SCAN_LIMIT
    if not limit:
        return None
    from celery import current_app

    name = queue_name()
    try:
        with current_app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=0)
            channel = conn.default_channel
            if not hasattr(channel, "unacked_key") or not hasattr(channel, "priority_steps"):
                return None  # not kombu's Redis transport
            return _read_redis(channel, name, limit)
    except Exception:  # noqa: BLE001 - an unanswerable broker is "cannot tell"
        logger.debug("Could not read the messages of queue %s", name, exc_info=True)
        return None


def _read_redis(channel: Any, queue: str, limit: int) -> set[str] | None:
    # kombu's Redis transport keeps a queue as one list per priority step (the key of step
    # 0 is the queue's name, the others `<name><sep><step>`, as Channel._q_for_pri names
    # them) and the delivered messages in the `unacked` hash, their delivery times in the
    # `unacked_index` sorted set.
    keys = [f"{queue}{channel.sep}{step}" if step else queue for step in channel.priority_steps]
    lease = agentrun_settings.LEASE_SECONDS
    with channel.conn_or_acquire() as client:
        sizes = client.pipeline(transaction=False)
        for key in keys:
            sizes.llen(key)
        sizes.hlen(channel.unacked_key)
        sizes.smembers(COMING)
        *counts, announced = sizes.execute()
        if sum(counts) > limit:
            return None
        found = _announced(client, sorted(_text(k) for k in announced))
        pipe = client.pipeline(transaction=True)
        pipe.time()
        for key in keys:
            pipe.lrange(key, 0, -1)
        pipe.hgetall(channel.unacked_key)
        pipe.zrange(channel.unacked_index_key, 0, -1, withscores=True)
        pipe.hgetall(f"{SEEN}:{queue}")
        (seconds, micros), *lists, unacked, delivered, seen = pipe.execute()
        now = seconds + micros / 1e6
        seen = {_text(tag): float(at) for tag, at in seen.items()}
        sighted: dict[str, float] = {}  # what SEEN holds after this read
        for raw in (m for messages in lists for m in messages):
            message = json.loads(raw)
            run_id = _run_of(message)
            if run_id:
                found.add(run_id)
            if run_id and _countdown(message) is not None:
                tag = _tag(message)
                sighted[tag] = seen.get(tag, now)
        times = {_text(tag): score for tag, score in delivered}
        for tag, raw in unacked.items():
            # Any queue's: a run's wake-up is its wake-up wherever it was routed.
            message = json.loads(raw)[0]
            run_id = _run_of(message)
            if not run_id:
                continue
            tag = _text(tag)
            first = sighted[tag] = seen.get(tag, now)
            age = max(now - times.get(tag, 0.0), now - first)
            if age < lease or _pending(message, first, now):
                found.add(run_id)
        _remember(client, f"{SEEN}:{queue}", seen, sighted)
    return found


def _announced(client: Any, keys: list[str]) -> set[str]:
    """The runs of the announcements still alive; expired ones leave the index."""
    if not keys:
        return set()
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.smembers(key)
    found: set[str] = set()
    gone = []
    for key, members in zip(keys, pipe.execute(), strict=True):
        if not members:
            gone.append(key)
        found.update(_text(m) for m in members)
    if gone:
        client.srem(COMING, *gone)
    return found


def _remember(client: Any, key: str, seen: dict[str, float], sighted: dict[str, float]) -> None:
    """First sights kept (never moved later), the messages no longer there forgotten."""
    new = {tag: at for tag, at in sighted.items() if tag not in seen}
    gone = [tag for tag in seen if tag not in sighted]
    if not new and not gone:
        return
    pipe = client.pipeline(transaction=False)
    for tag, at in new.items():
        pipe.hsetnx(key, tag, repr(at))
    if gone:
        pipe.hdel(key, *gone)
    pipe.execute()


def _run_of(message: dict) -> str | None:
    """The run id of an advance_run message, or None for another task's."""
    headers = message.get("headers") or {}
    if headers.get("task") != TASK:
        return None
    args = headers.get("argsrepr") or ""
    try:
        properties = message.get("properties") or {}
        body = message["body"]
        if properties.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        decoded = json.loads(body)
        return str(decoded[0][0])
    except (KeyError, IndexError, TypeError, ValueError):
        found = _UUID.search(args)
        return found.group(0) if found else None


def _tag(message: dict) -> str:
    return _text((message.get("properties") or {}).get("delivery_tag", ""))


def _countdown(message: dict) -> float | None:
    value = (message.get("headers") or {}).get(COUNTDOWN_HEADER)
    return float(value) if isinstance(value, int | float) else None


def _pending(message: dict, first: float, now: float) -> bool:
    """A countdown still to run (Celery keeps such a message unacknowledged until then),
    with a lease's slack for the worker to start it: counted from the reaper's first sight
    of the message (the broker's clock). A message without the header (sent before it
    existed) by its `eta` (the publisher's clock)."""
    lease = agentrun_settings.LEASE_SECONDS
    countdown = _countdown(message)
    if countdown is not None:
        return first + countdown + lease > now
    eta = (message.get("headers") or {}).get("eta")
    if not eta:
        return False
    try:
        when = datetime.fromisoformat(eta).timestamp()
    except ValueError:
        return False
    return when + lease > now


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
