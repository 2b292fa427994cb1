"""A command's unit of work tried again when the database settled a race by rolling it back
(a deadlock, a serialization failure, a lock timeout): the locks are taken in one order
(store/locks.py), so this is rare, but never a server error. The new attempt reads the
rows again, so it answers what is true now (a decision on a call that was closed
meanwhile is refused as such); after a few attempts, ConcurrentUpdate (409 in the API)."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.db import DatabaseError, transaction

from .. import store
from ..exceptions import ConcurrentUpdate

logger = logging.getLogger(__name__)

ATTEMPTS = 4
FIRST_PAUSE = 0.02  # seconds, doubled each attempt, with jitter

F = TypeVar("F", bound=Callable[..., Any])


def retry_lost_race(func: F) -> F:
    """Run `func` (which opens its own transaction) again when it lost a race."""

    @functools.wraps(func)
    def attempt(*args: Any, **kwargs: Any) -> Any:
        for n in range(1, ATTEMPTS + 1):
            try:
                return func(*args, **kwargs)
            except DatabaseError as exc:
                if not store.lost_race(exc):
                    raise
                if transaction.get_connection().in_atomic_block or n == ATTEMPTS:
                    # A caller's transaction is aborted with it: only the caller may retry.
                    raise ConcurrentUpdate(
                        f"{func.__name__} lost a race with a concurrent change "
                        f"({store.sqlstate(exc)}): try again."
                    ) from exc
                logger.info(
                    "Retrying %s after a lost race (%s), attempt %s",
                    func.__name__,
                    store.sqlstate(exc),
                    n + 1,
                )
                time.sleep(FIRST_PAUSE * 2 ** (n - 1) * (0.5 + random.random()))  # noqa: S311
        raise AssertionError("unreachable")

    return cast(F, attempt)
