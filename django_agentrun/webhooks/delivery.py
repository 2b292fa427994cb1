"""Sending the outbox's deliveries: one try at a time, each recorded (`WebhookAttempt`),
retried on the schedule (AGENTRUN_WEBHOOK_RETRY_SECONDS) until a 2xx answer or the end of
the schedule; the reaper's pass (`sweep`) sends again what a lost task left; `resend`
starts a new cycle of tries under the same webhook id.

Delivery is at least once: a worker killed after the receiver answered and before the try
was recorded sends it again (receivers deduplicate by `webhook-id`). Never twice at once:
a try takes the delivery's hold for twice AGENTRUN_WEBHOOK_TIMEOUT_SECONDS and 5 s, and
ends (or is given up) within the timeout however slowly the receiver answers; a try whose
hold was taken meanwhile (its process was stopped) records its attempt, not the delivery's
state.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx2
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ..conf import agentrun_settings
from ..failpoints import failpoint
from ..fields import storable_text
from ..models import DeliveryKind, DeliveryStatus, WebhookAttempt, WebhookDelivery
from ..store import outbox
from . import mail, policy, signing

logger = logging.getLogger(__name__)

#: At most this much of a response body is kept (the rest is never read).
EXCERPT_BYTES = 1024
#: A retry due within this many seconds is handed to a worker with a countdown; a later one
#: is found by the reaper's pass (countdowns stay short: the broker's visibility timeout).
COUNTDOWN_MAX_SECONDS = 60.0
USER_AGENT = "django-agentrun-webhooks"


@dataclass
class Tried:
    """What one try found: delivered, or why not (and whether to try again)."""

    delivered: bool
    status_code: int | None = None
    error: str = ""
    excerpt: str = ""
    final: bool = False


def deliver(delivery_id: Any) -> str:
    """Try a due delivery once, if no other worker holds it; what happened, in a word."""
    now = timezone.now()
    # Held for longer than a try takes; a worker killed during one leaves it for this long.
    hold = now + timedelta(seconds=agentrun_settings.WEBHOOK_TIMEOUT_SECONDS * 2 + 5)
    taken = (
        WebhookDelivery.objects.filter(
            pk=delivery_id,
            status=DeliveryStatus.PENDING,
            next_attempt_at__lte=now + timedelta(seconds=1),
        )
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .update(locked_until=hold)
    )
    if not taken:
        return "not due"
    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    failpoint("webhook.before_send")
    started, clock = timezone.now(), time.monotonic()
    if delivery.kind == DeliveryKind.EMAIL:
        outcome = _email(delivery)
    else:
        outcome = _post(delivery)
    return _record(delivery, outcome, started, time.monotonic() - clock, hold)


def _email(delivery: WebhookDelivery) -> Tried:
    try:
        return Tried(True, excerpt=mail.send(delivery))
    except ValueError as exc:
        return Tried(False, error=str(exc), final=True)
    except Exception as exc:  # noqa: BLE001 - the mail server's error, tried again later
        return Tried(False, error=f"{type(exc).__name__}: {exc}")


def _post(delivery: WebhookDelivery) -> Tried:
    sub = outbox.subscription(delivery.subscription)
    if sub is None:
        return Tried(False, error="The subscription was removed or deactivated", final=True)
    if sub.url != delivery.url:
        delivery.url = sub.url
        WebhookDelivery.objects.filter(pk=delivery.pk).update(url=sub.url)
    try:
        addresses = policy.check(sub.url, agentrun_settings.WEBHOOK_ALLOWED_HOSTS)
    except policy.UrlRefused as exc:
        # Tried again on the schedule, as any failed try: the host may allow it, or its
        # name resolve elsewhere, before the schedule is spent.
        return Tried(False, error=str(exc))
    target, host, extensions = policy.pinned(sub.url, addresses)
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    headers = signing.headers(sub.secret, delivery.webhook_id, timezone.now(), body)
    headers["user-agent"] = USER_AGENT
    headers.update(host)
    request = (target, body, headers, extensions)
    timeout = agentrun_settings.WEBHOOK_TIMEOUT_SECONDS
    answered: list[Any] = []
    # The whole try within the timeout (httpx's own bounds each read, not the sum: a
    # receiver answering a byte at a time would outlive the hold and the try be sent again
    # beside it). A try given up goes on in the background until httpx's bounds end it.
    thread = threading.Thread(target=_exchange, args=(request, timeout, answered), daemon=True)
    thread.start()
    thread.join(timeout)
    if not answered:
        return Tried(False, error=f"No complete answer within {timeout:g} s")
    if isinstance(answered[0], httpx2.HTTPError):
        exc = answered[0]
        return Tried(False, error=f"{type(exc).__name__}: {exc}")
    if isinstance(answered[0], BaseException):
        raise answered[0]
    code, excerpt = answered[0]
    if 200 <= code < 300:
        return Tried(True, status_code=code, excerpt=excerpt)
    return Tried(False, status_code=code, error=f"HTTP {code}", excerpt=excerpt)


def _exchange(request: tuple[Any, ...], timeout: float, answered: list[Any]) -> None:
    """One request and the start of its answer, in the thread `_post` waits for: (status
    code, excerpt), or the error, appended to `answered`."""
    target, body, headers, extensions = request
    try:
        with httpx2.Client(follow_redirects=False, timeout=timeout, trust_env=False) as client:
            with client.stream(
                "POST", target, content=body, headers=headers, extensions=extensions
            ) as response:
                answered.append((response.status_code, _excerpt(response)))
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
        answered.append(exc)


def _excerpt(response: Any) -> str:
    read = b""
    for chunk in response.iter_bytes():
        read += chunk
        if len(read) >= EXCERPT_BYTES:
            break
    return storable_text(read[:EXCERPT_BYTES].decode("utf-8", errors="replace"))


def _record(
    delivery: WebhookDelivery, outcome: Tried, started: Any, seconds: float, hold: Any
) -> str:
    tries = delivery.attempts + 1
    fields: dict[str, Any] = {"attempts": tries, "locked_until": None}
    delay = None
    if outcome.delivered:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=timezone.now(), last_error="")
    else:
        fields["last_error"] = storable_text(outcome.error)
        if not outcome.final:
            delay = signing.retry_delay(
                tries,
                agentrun_settings.WEBHOOK_RETRY_SECONDS,
                agentrun_settings.WEBHOOK_RETRY_JITTER,
            )
        if delay is None:
            fields["status"] = DeliveryStatus.FAILED
        else:
            fields["next_attempt_at"] = timezone.now() + timedelta(seconds=delay)
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery=delivery,
            cycle=delivery.cycle,
            number=tries,
            started_at=started,
            duration_ms=int(seconds * 1000),
            status_code=outcome.status_code,
            error=storable_text(outcome.error),
            response_excerpt=outcome.excerpt,
        )
        # Fenced by the hold: a try that outlived it (its process stopped) leaves the
        # delivery to the try that took it over.
        held = WebhookDelivery.objects.filter(pk=delivery.pk, locked_until=hold)
        if not held.update(**fields):
            logger.warning(
                "Webhook delivery %s: its hold was taken while a try ran; recorded that try only",
                delivery.webhook_id,
            )
            return "taken over"
    if delay is not None and delay <= COUNTDOWN_MAX_SECONDS:
        outbox.dispatch([str(delivery.pk)], countdown=delay)
    if outcome.delivered:
        return "delivered"
    logger.warning(
        "Webhook delivery %s (%s) try %d failed: %s",
        delivery.webhook_id,
        delivery.event_type,
        tries,
        outcome.error,
    )
    return "retrying" if delay is not None else "failed"


def sweep(limit: int = 100) -> int:
    """Hand to a worker the deliveries due for AGENTRUN_WEBHOOK_LOST_AFTER_SECONDS that no
    worker holds (their task was lost, or their retry is due); how many. Each is due again
    only a grace period later, so a slow queue is not flooded with duplicates."""
    now = timezone.now()
    lost = now - timedelta(seconds=agentrun_settings.WEBHOOK_LOST_AFTER_SECONDS)
    ids = list(
        WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=lost)
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    if ids:
        WebhookDelivery.objects.filter(pk__in=ids, status=DeliveryStatus.PENDING).update(
            next_attempt_at=now
        )
        outbox.dispatch([str(pk) for pk in ids])
    return len(ids)


def resend(deliveries: Any) -> int:
    """Start a new cycle of tries (the schedule from its start) under the same webhook ids;
    how many. They are handed to a worker once the caller's transaction commits."""
    ids = [str(d.pk) for d in deliveries]
    count = WebhookDelivery.objects.filter(pk__in=ids).update(
        status=DeliveryStatus.PENDING,
        attempts=0,
        cycle=F("cycle") + 1,
        next_attempt_at=timezone.now(),
        locked_until=None,
        delivered_at=None,
        last_error="",
    )
    transaction.on_commit(lambda: outbox.dispatch(ids), robust=True)
    return count
