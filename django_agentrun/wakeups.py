"""Waking a worker for a run: the one place that publishes `advance_run`, and the one
place that asks the broker how many wake-ups are still waiting.

A message is only a wake-up call (the engine decides from the database), so a lost one
costs time, not correctness: the reaper re-sends it. It must neither wait long for that
nor pile duplicates onto runs that merely wait behind others in a busy queue, so it asks
the broker first (`queued_messages`).
"""

from __future__ import annotations

import logging
from typing import Any

from .conf import agentrun_settings
from .failpoints import failpoint

logger = logging.getLogger(__name__)

TASK = "django_agentrun.advance_run"


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
