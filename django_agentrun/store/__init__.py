"""The store: every statement the engine and the reaper write by hand, and the one piece
of code that sends them. No policy, no Celery.

- queries.sql / sql.py: the statements, by name;
- unit.py: a unit of work that composes a step's writes into one statement on Postgres
  (sent alone in autocommit when it is the only one) and runs them one by one elsewhere;
- runs.py: the fenced run write with its events, and its refusals;
- leases.py: claim (with the history), renew, poll, release, take over;
- rows.py, clock.py: rows to statements and back; the database's time.
"""

from __future__ import annotations

from .clock import DatabaseNow, database_now
from .leases import Claimed, claim, poll_cancel, release_lease, renew_lease, take_lease
from .runs import FENCE_CONSTRAINT, Event, Lease, RunWrite, refused
from .unit import Unit, unit

__all__ = [
    "FENCE_CONSTRAINT",
    "Claimed",
    "DatabaseNow",
    "Event",
    "Lease",
    "RunWrite",
    "Unit",
    "claim",
    "database_now",
    "poll_cancel",
    "refused",
    "release_lease",
    "renew_lease",
    "take_lease",
    "unit",
]
