"""Standard Webhooks' headers and signature (the `standardwebhooks` library), and the
retry schedule's delays. No database."""

from __future__ import annotations

import random
from datetime import datetime

from standardwebhooks import Webhook


def headers(secret: str, webhook_id: str, timestamp: datetime, body: bytes) -> dict[str, str]:
    """The headers of one try: `webhook-id` (the same on every try: receivers deduplicate
    by it), `webhook-timestamp` (this try's, in seconds) and `webhook-signature`."""
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": Webhook(secret).sign(webhook_id, timestamp, body),
    }


def retry_delay(
    tries: int, schedule: list[float], jitter: float, rand: random.Random | None = None
) -> float | None:
    """Seconds to wait after the `tries`-th failed try (1 = the first), stretched by up to
    `jitter` of themselves at random so that receivers that failed together are not retried
    together; None when the schedule is spent (give up)."""
    if tries < 1 or tries > len(schedule):
        return None
    base = float(schedule[tries - 1])
    return base * (1.0 + jitter * (rand or random).random())


def total_seconds(schedule: list[float]) -> float:
    """How long retries go on at least (without jitter): the documented time."""
    return float(sum(schedule))
