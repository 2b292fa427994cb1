"""A request the Messages API refused for a limit (429, 529) or the rate-limit governor held
back: nothing was answered and nothing paid, so the run is parked (its lease and slot given
back, woken when the limit allows), or fails once the API has refused its turn too often."""

from __future__ import annotations

import logging
import random
from typing import Any

from ..clients import RateLimited
from ..conf import agentrun_settings
from ..events import EventType
from ..models import RunEvent, Turn
from .follows import At, Ended, commit_of
from .step import Commit, Step

logger = logging.getLogger(__name__)


def parked(step: Step, turn: Turn, exc: RateLimited) -> Commit:
    """The commit of a request refused for a limit (nothing answered, nothing paid): the
    run parked until the limit allows, or failed after too many refusals of this turn.

    The wait is the API's: `retry-after`, or the exhausted limit's reset (clients/anthropic
    `wait_of`; "Earlier retries will fail", https://platform.claude.com/docs/en/api/rate-limits);
    without either, the engine's backoff, doubled on each refusal of the turn. It ends by the
    run's deadline (the claim after it times the run out). The API's refusals (429, 529) of
    one turn are counted (`model_rate_limited` events): past AGENTRUN_MODEL_RATE_LIMIT_PARKS
    the run fails with `rate_limited` and the API's last message; the governor's own "not
    now" (the fair share's queue, no status) is not counted."""
    settings = agentrun_settings
    refused = exc.status in (429, 529)
    parks = rate_limit_parks(step.run, turn.index) + 1 if refused else 0
    if refused and parks > settings.MODEL_RATE_LIMIT_PARKS:
        message = (
            f"The Messages API refused this turn {parks - 1} times for a limit "
            f"(AGENTRUN_MODEL_RATE_LIMIT_PARKS); it said: {exc}"
        )
        failed = {"code": "rate_limited", "message": message[:2000], "phase": "model"}
        return commit_of(step, step.write(), At.ANSWER, Ended.MODEL_FAILED, **failed)
    if exc.retry_after:
        delay = exc.retry_after * (1 + random.random() / 10)  # never sooner than it says
    else:
        base = settings.MODEL_RETRY_BASE_SECONDS * 2 ** max(0, parks - 1)
        delay = min(base, settings.MODEL_RETRY_MAX_SECONDS) * (1 + random.random() / 5)
    if step.run.deadline is not None:
        left = (step.run.deadline - step.now()).total_seconds()
        delay = min(delay, max(0.0, left) + 0.5)  # the claim then times the run out
    logger.info("Rate limited (%s), parked for %.1fs run_id=%s", exc, delay, step.run_id)
    limited = None
    if refused:
        limited = {"turn_index": turn.index, "parks": parks, "status": exc.status}
        limited.update(wait_seconds=round(delay, 3), message=str(exc)[:500])
    return commit_of(
        step, step.write(), At.ANSWER, Ended.RATE_LIMITED, delay=delay, limited=limited
    )


def rate_limit_parks(run: Any, turn_index: int) -> int:
    """How many times the API refused `run`'s turn `turn_index` for a limit (its
    `model_rate_limited` events: a query on the rare path of a refusal only)."""
    return sum(
        1
        for payload in RunEvent.objects.filter(
            run_id=run.pk, type=EventType.MODEL_RATE_LIMITED
        ).values_list("payload", flat=True)
        if isinstance(payload, dict) and payload.get("turn_index") == turn_index
    )
