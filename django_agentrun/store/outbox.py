"""The outbox: the webhook (and e-mail) deliveries a write's events call for, inserted in
the write's own transaction by whichever store sends it, so that a delivery exists exactly
when the change it reports was committed.

Deciding costs a dict lookup per event: a write without a reportable event (nearly every
write of a turn) or whose events no subscription wants is sent exactly as before, with
no extra statement. Subscriptions come from AGENTRUN_WEBHOOKS (settings) and from the
admin's table, read at most every AGENTRUN_WEBHOOK_SUBSCRIPTIONS_CACHE_SECONDS per process
(and only when a write has a reportable event). After the commit each delivery is handed
to the task that sends it (`register`: tasks.py); a lost hand-off is found by the reaper's
pass (webhooks.sweep).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from ..conf import agentrun_settings
from ..events import EventType
from ..models import DeliveryKind, ToolCall, WebhookDelivery, WebhookSubscription
from .writes import Write

logger = logging.getLogger(__name__)

#: The webhook event types, by the run event that reports them.
EVENTS: dict[str, str] = {
    EventType.APPROVAL_REQUESTED: "tool_call.awaiting_approval",
    EventType.TOOL_CALL_UNKNOWN: "tool_call.unknown",
    EventType.RUN_COMPLETED: "run.completed",
    EventType.RUN_FAILED: "run.failed",
    EventType.RUN_CANCELLED: "run.cancelled",
    EventType.RUN_TIMED_OUT: "run.timed_out",
}
#: Also sent for each of the four run endings of a run that belongs to a conversation.
CONVERSATION_RUN_FINISHED = "conversation.run_finished"
RUN_ENDINGS = ("run.completed", "run.failed", "run.cancelled", "run.timed_out")
ALL_EVENTS: tuple[str, ...] = (*EVENTS.values(), CONVERSATION_RUN_FINISHED)
#: What the approvers are e-mailed about (AGENTRUN_APPROVAL_EMAILS).
EMAILED = ("tool_call.awaiting_approval", "tool_call.unknown")


@dataclass(frozen=True)
class Subscription:
    """A receiver: from settings (AGENTRUN_WEBHOOKS) or the admin's table."""

    name: str
    url: str
    secret: str
    events: frozenset[str]

    def wants(self, event_type: str) -> bool:
        return "*" in self.events or event_type in self.events


_admin_cache: tuple[float, list[Subscription]] = (float("-inf"), [])
_sender: Callable[..., Any] | None = None


def register(sender: Callable[..., Any]) -> None:
    """What hands a committed delivery (its id) to a worker (tasks.py registers it: this
    module sits below the Celery surface)."""
    global _sender
    _sender = sender


def settings_subscriptions() -> list[Subscription]:
    return [
        Subscription(
            name=str(entry["name"]),
            url=str(entry["url"]),
            secret=str(entry["secret"]),
            events=frozenset(entry.get("events") or ()),
        )
        for entry in agentrun_settings.WEBHOOKS
    ]


def admin_subscriptions(*, fresh: bool = False) -> list[Subscription]:
    """The admin's active subscriptions, kept per process for a few seconds."""
    global _admin_cache
    seconds = agentrun_settings.WEBHOOK_SUBSCRIPTIONS_CACHE_SECONDS
    if seconds is None:  # settings' subscriptions only: the table is never read
        return []
    read_at, found = _admin_cache
    now = time.monotonic()
    if fresh or now - read_at >= seconds:
        found = [
            Subscription(s.name, s.url, s.secret, frozenset(s.events or ()))
            for s in WebhookSubscription.objects.filter(active=True)
        ]
        _admin_cache = (now, found)
    return found


def forget_subscriptions() -> None:
    """Read the admin's subscriptions again at the next reportable event (after a change)."""
    global _admin_cache
    _admin_cache = (float("-inf"), [])


def subscription(name: str) -> Subscription | None:
    """The subscription called `name`, as it is now (its secret may have been rotated)."""
    for sub in settings_subscriptions():
        if sub.name == name:
            return sub
    row = WebhookSubscription.objects.filter(name=name, active=True).first()
    if row is None:
        return None
    return Subscription(row.name, row.url, row.secret, frozenset(row.events or ()))


def reported(write: Write) -> list[tuple[str, dict[str, Any]]]:
    """The webhook events a write's events make: (type, run event payload). Free for a
    write without any."""
    found = [(EVENTS[kind], data) for kind, data in write.events if kind in EVENTS]
    if found and write.run.conversation_id is not None:
        found += [(CONVERSATION_RUN_FINISHED, d) for t, d in found if t in RUN_ENDINGS]
    return found


def wanted(write: Write) -> list[WebhookDelivery]:
    """The deliveries `write` calls for (unsaved), or [] (nearly always: then nothing is
    read nor written)."""
    events = reported(write) if write.events else []
    if not events:
        return []
    subs = [*settings_subscriptions(), *admin_subscriptions()]
    emails = agentrun_settings.APPROVAL_EMAILS
    rows: list[WebhookDelivery] = []
    for event_type, data in events:
        targets = [s for s in subs if s.wants(event_type)]
        mail = emails and event_type in EMAILED
        if not targets and not mail:
            continue
        payload = _payload(write, event_type, data)
        for sub in targets:
            rows.append(_row(write, DeliveryKind.WEBHOOK, event_type, payload, sub))
        if mail:
            rows.append(_row(write, DeliveryKind.EMAIL, event_type, payload, None))
    return rows


def insert(write: Write, rows: list[WebhookDelivery]) -> None:
    """Insert the deliveries (inside the write's transaction, after its statement) and hand
    each to a worker once it commits."""
    for row in rows:
        row.payload["data"].update(_call_details(write, row.payload["data"]))
    WebhookDelivery.objects.bulk_create(rows)
    ids = [str(row.pk) for row in rows]
    write.then(lambda: dispatch(ids))


def dispatch(ids: list[str], countdown: float | None = None) -> None:
    """Hand deliveries to a worker (now, or after `countdown` seconds); a broker error is
    logged, not raised (the reaper's pass sends them later)."""
    for pk in ids:
        try:
            if _sender is None:
                raise RuntimeError("django_agentrun's tasks are not loaded (AppConfig.ready)")
            _sender(pk, countdown=countdown)
        except Exception:  # broker down: webhooks.sweep sends it later
            logger.exception("Could not enqueue webhook delivery %s", pk)


def _row(
    write: Write, kind: str, event_type: str, payload: dict[str, Any], sub: Subscription | None
) -> WebhookDelivery:
    return WebhookDelivery(
        kind=kind,
        subscription=sub.name if sub else "",
        url=sub.url if sub else "",
        event_type=event_type,
        run_id=write.run.pk,
        payload={**payload, "data": dict(payload["data"])},
    )


def _payload(write: Write, event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """The JSON body Standard Webhooks recommends ({type, timestamp, data}): identities,
    states and codes only; never a tool's arguments or result, never a token."""
    run = write.run
    body: dict[str, Any] = {
        "run_id": str(run.pk),
        "agent": run.agent,
        "run_state": run.state,
        "correlation_id": run.correlation_id or None,
        "conversation_id": str(run.conversation_id) if run.conversation_id else None,
    }
    for key in ("tool_call_id", "turn_index", "stop_reason", "error_code"):
        if key in data:
            body[key] = data[key]
    return {"type": event_type, "timestamp": timezone.now().isoformat(), "data": body}


def _call_details(write: Write, data: dict[str, Any]) -> dict[str, Any]:
    """The tool's name and the decision page of the call a webhook names (its row has its
    primary key once the write's statement ran)."""
    tool_call_id = data.get("tool_call_id")
    if tool_call_id is None:
        return {}
    objs = [*write.added, *(c.obj for c in write.changed)]
    call = next(
        (
            o
            for o in objs
            if isinstance(o, ToolCall)
            and o.tool_call_id == tool_call_id
            and o.turn_index == data.get("turn_index")
        ),
        None,
    )
    if call is None:
        return {}
    details: dict[str, Any] = {"tool_name": call.name}
    base = agentrun_settings.WEBHOOK_ADMIN_URL
    if base and call.pk is not None:
        try:
            path = reverse("admin:agentrun_toolcall_change", args=[call.pk])
        except NoReverseMatch:
            return details
        details["decision_url"] = base.rstrip("/") + path
    return details
