"""Waking a worker for a run: the one place that publishes `advance_run`, and the one
place that asks the broker how many wake-ups are still waiting.

A message is only a wake-up call (the engine decides from the database), so a lost one
costs time, not correctness: the reaper re-sends it. It must neither wait long for that
nor pile duplicates onto runs that merely wait behind others in a busy queue, so it asks
the broker first (`queued_messages`).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from datetime import datetime
from typing import Any

from .conf import agentrun_settings
from .failpoints import failpoint

logger = logging.getLogger(__name__)

TASK = "django_agentrun.advance_run"
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")


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
    try:
        if _task is None:
            raise RuntimeError("django_agentrun's tasks are not loaded (AppConfig.ready)")
        _task.apply_async(args=[str(run_id)], **options)
    except Exception:  # broker down: the reaper re-enqueues runs nobody advances
        logger.exception("Could not enqueue advance_run run_id=%s", run_id)


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

    Held means: waiting in the queue (at any priority), or delivered to a worker and not
    yet acknowledged (kombu's `unacked` hash) less than a lease ago, or with a countdown
    still to run. A delivered message older than that belongs to a worker that died with
    it (kombu restores it only after its visibility timeout, an hour by default): it is
    not counted. Everything is read in one MULTI/EXEC, a consistent snapshot; a message is
    in neither place only for the instant between a worker's BRPOP and its bookkeeping,
    which the reaper covers by looking twice (reaper._lost_wakeups)."""
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
    with channel.conn_or_acquire() as client:
        sizes = client.pipeline(transaction=False)
        for key in keys:
            sizes.llen(key)
        sizes.hlen(channel.unacked_key)
        if sum(sizes.execute()) > limit:
            return None
        pipe = client.pipeline(transaction=True)
        for key in keys:
            pipe.lrange(key, 0, -1)
        pipe.hgetall(channel.unacked_key)
        pipe.zrange(channel.unacked_index_key, 0, -1, withscores=True)
        now = time.time()
        *lists, unacked, delivered = pipe.execute()
    found: set[str] = set()
    for raw in (m for messages in lists for m in messages):
        run_id = _run_of(json.loads(raw), now, None)
        if run_id:
            found.add(run_id)
    fresh = now - agentrun_settings.LEASE_SECONDS
    times = {_text(tag): score for tag, score in delivered}
    for tag, raw in unacked.items():
        # Any queue's: a run's wake-up is its wake-up wherever it was routed.
        message = json.loads(raw)[0]
        run_id = _run_of(message, now, times.get(_text(tag), 0.0) >= fresh)
        if run_id:
            found.add(run_id)
    return found


def _run_of(message: dict, now: float, fresh: bool | None) -> str | None:
    """The run id of an advance_run message, if it counts as held (see waiting_runs)."""
    headers = message.get("headers") or {}
    if headers.get("task") != TASK:
        return None
    if fresh is False and not _eta_ahead(headers.get("eta"), now):
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


def _eta_ahead(eta: str | None, now: float) -> bool:
    """A countdown still to run (Celery keeps such a message unacknowledged until then),
    with a lease's slack for the worker to start it."""
    if not eta:
        return False
    try:
        when = datetime.fromisoformat(eta).timestamp()
    except ValueError:
        return False
    return when + agentrun_settings.LEASE_SECONDS > now


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
