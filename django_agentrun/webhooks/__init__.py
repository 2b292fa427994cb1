"""Webhooks and approval e-mails from the outbox (store/outbox.py writes the deliveries in
the transaction of the change they report): signing (Standard Webhooks), the URL policy,
the tries and their schedule (delivery), the e-mail to the approvers (mail).
See docs/how-to/webhooks.md."""

from __future__ import annotations

from ..store.outbox import ALL_EVENTS, forget_subscriptions
from .config import problems, refused_urls
from .delivery import EXCERPT_BYTES, Tried, deliver, resend, sweep
from .policy import UrlRefused, check, pinned
from .signing import headers, retry_delay, total_seconds

__all__ = [
    "ALL_EVENTS",
    "EXCERPT_BYTES",
    "Tried",
    "UrlRefused",
    "check",
    "pinned",
    "deliver",
    "forget_subscriptions",
    "headers",
    "problems",
    "refused_urls",
    "resend",
    "retry_delay",
    "sweep",
    "total_seconds",
]
