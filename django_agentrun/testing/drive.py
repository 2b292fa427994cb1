"""Advance a run in the test's own process, without a Celery worker."""

from __future__ import annotations

from typing import Any


def drive(run: Any, *, client: Any = None, limit: int = 50) -> Any:
    """Advance `run` here, turn by turn, until it rests (finished, parked for a person,
    or not claimable); return it refreshed from the database.

    `client` defaults to the configured model client (AGENTRUN_MODEL_CLIENT; the
    `agentrun_messages_api` fixture points it at the stand-in). Inside pytest-django's
    `db` fixture nothing is committed, so nothing is sent to the broker either.
    """
    from ..engine import Outcome, advance

    for _ in range(limit):
        if advance(run.pk, client=client) != Outcome.CONTINUED:
            break
    else:
        raise RuntimeError(f"run {run.pk} was still advancing after {limit} turns")
    run.refresh_from_db()
    return run
