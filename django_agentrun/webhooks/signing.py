"""Standard Webhooks' headers and signature (the `standardwebhooks` library), and the
retry schedule's delays. No database."""

from __future__ import annotations

import base64
import binascii
import random
from datetime import datetime

from standardwebhooks import Webhook

#: The shortest signing key accepted: Standard Webhooks' secrets are 24 to 64 bytes.
MIN_SECRET_BYTES = 24


def secret_problem(secret: object) -> str | None:
    """What is wrong with a signing secret, if anything: it must be `whsec_` and the base64
    of at least MIN_SECRET_BYTES bytes (a short key can be guessed, and then forged)."""
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        return "a Standard Webhooks secret starts with whsec_"
    try:
        key = base64.b64decode(secret.removeprefix("whsec_") + "==", validate=False)
        Webhook(secret)
    except (binascii.Error, ValueError, Exception):  # noqa: BLE001 - the library's words
        return "a Standard Webhooks secret is whsec_ and base64"
    if len(key) < MIN_SECRET_BYTES:
        return (
            f"the secret's key is {len(key)} bytes; at least {MIN_SECRET_BYTES} (whsec_ and "
            f"the base64 of {MIN_SECRET_BYTES} random bytes or more)"
        )
    return None


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
