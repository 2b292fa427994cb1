"""Thin Celery tasks: ids in, engine and services do the work.

A message is only a wake-up call: the engine decides from the database, so
redelivery and duplicates are harmless (a duplicate finds the lease taken).
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError

from . import wakeups, webhooks
from .conf import agentrun_settings
from .engine import advance
from .reaper import reap as reap_now
from .store import outbox

logger = logging.getLogger(__name__)

# Late acks + reject on worker lost: a killed pool child's message is redelivered.
TASK_OPTIONS = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "ignore_result": True,
}


@shared_task(name="django_agentrun.advance_run", bind=True, max_retries=5, **TASK_OPTIONS)
def advance_run(self, run_id: str) -> str:
    """Advance a run by at most one turn."""
    try:
        outcome = advance(run_id, heartbeat=True)
    except (OperationalError, InterfaceError) as exc:
        # A database hiccup: the lease (if any) lapses, and a retry or the reaper goes on.
        logger.warning("Database error advancing run_id=%s; retrying", run_id, exc_info=True)
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, 30)) from exc
    logger.debug("advance_run run_id=%s outcome=%s", run_id, outcome)
    return outcome


@shared_task(name="django_agentrun.reap", **TASK_OPTIONS)
def reap() -> dict | None:
    """Find runs nobody is advancing and repair them (see recovery.reap). None: nothing
    to do (and Celery's per-task log lines of such a pass are dropped, see IdleReaperFilter)."""
    report = reap_now()
    resent = webhooks.sweep()
    if resent:
        logger.info("Webhook deliveries handed to a worker again: %d", resent)
    if not report.findings and not resent:
        return None
    return {**report.as_dict(), **({"webhooks": resent} if resent else {})}


@shared_task(name="django_agentrun.deliver_webhook", **TASK_OPTIONS)
def deliver_webhook(delivery_id: str) -> str:
    """Try one webhook (or approval e-mail) delivery of the outbox, if it is due."""
    return webhooks.deliver(delivery_id)


def _send_delivery(delivery_id: str, countdown: float | None = None) -> None:
    options: dict = {"countdown": countdown} if countdown else {}
    if agentrun_settings.QUEUE:
        options["queue"] = agentrun_settings.QUEUE
    deliver_webhook.apply_async(args=[delivery_id], **options)


class IdleReaperFilter(logging.Filter):
    """The reaper runs every few seconds; Celery logs each task it receives and each that
    succeeds at INFO. Keep the reaper's lines only for passes that did something (the
    reaper logs each action itself): drop its "received" lines and its "succeeded" lines
    that returned None."""

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if not isinstance(data, dict) or data.get("name") != "django_agentrun.reap":
            return True
        if "return_value" in data:
            return data["return_value"] != "None"
        return "runtime" in data or record.levelno > logging.INFO


def _quiet_idle_reaper() -> None:
    for name in ("celery.app.trace", "celery.worker.strategy"):
        log = logging.getLogger(name)
        if not any(isinstance(f, IdleReaperFilter) for f in log.filters):
            log.addFilter(IdleReaperFilter())


_quiet_idle_reaper()
wakeups.register(advance_run)
outbox.register(_send_delivery)
