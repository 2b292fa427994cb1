"""The account's rate limit, as the Messages API enforces and reports it.

Source: https://docs.claude.com/en/api/rate-limits. The API measures requests (and input
and output tokens) per minute with a token bucket that is replenished continuously up to
the limit, and may enforce a minute's limit over shorter intervals ("60 RPM may be
enforced as 1 request per second"): here the bucket holds one second's worth of requests.
Every answer carries `anthropic-ratelimit-requests-limit` (the per-minute limit),
`-remaining` (whole requests left now) and `-reset` (RFC 3339: when the bucket is full
again); a refusal is `429 rate_limit_error` with `retry-after` (seconds to wait, a whole
number, as the API sends it) and the same headers. Token limits (`input-tokens`,
`output-tokens`) are reported when given, never enforced here.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, datetime
from typing import Any

PREFIX = "anthropic-ratelimit-"


class AccountLimit:
    """`requests_per_second` for the whole account (every key, every connection)."""

    def __init__(
        self,
        requests_per_second: float,
        *,
        input_tokens_per_minute: int | None = None,
        output_tokens_per_minute: int | None = None,
    ) -> None:
        self.rate = float(requests_per_second)
        self.capacity = max(1.0, self.rate)
        self.tokens_limits = {
            "input-tokens": input_tokens_per_minute,
            "output-tokens": output_tokens_per_minute,
        }
        self._level = self.capacity
        self._at = time.monotonic()
        self._lock = threading.Lock()
        self.refused = 0
        self.allowed = 0

    def take(self) -> tuple[bool, dict[str, str]]:
        """Spend one request if the bucket has one: (allowed, the headers to answer with)."""
        with self._lock:
            now = time.monotonic()
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
            allowed = self._level >= 1.0
            if allowed:
                self._level -= 1.0
                self.allowed += 1
            else:
                self.refused += 1
            headers = self._headers(now)
            if not allowed:
                headers["retry-after"] = str(max(1, math.ceil((1.0 - self._level) / self.rate)))
            return allowed, headers

    def _headers(self, now: float) -> dict[str, str]:
        full_in = (self.capacity - self._level) / self.rate
        reset = datetime.fromtimestamp(time.time() + full_in, UTC)
        headers: dict[str, Any] = {
            f"{PREFIX}requests-limit": str(round(self.rate * 60)),
            f"{PREFIX}requests-remaining": str(int(self._level)),
            f"{PREFIX}requests-reset": reset.isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        stamp = datetime.fromtimestamp(time.time(), UTC).isoformat(timespec="seconds")
        for name, limit in self.tokens_limits.items():
            if limit:
                headers[f"{PREFIX}{name}-limit"] = str(limit)
                headers[f"{PREFIX}{name}-remaining"] = str(limit)
                headers[f"{PREFIX}{name}-reset"] = stamp.replace("+00:00", "Z")
        return headers
