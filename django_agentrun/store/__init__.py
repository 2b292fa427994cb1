"""The store: every statement the engine and the reaper send by hand, and the one piece of
code that sends them. No policy, no Celery.

- queries.sql / sql.py: the statements, complete and by name;
- writes.py: a write (what one commit changes) and `send`, one statement on Postgres;
- leases.py: claim (with the history; a follow-up's earlier runs' too), renew, poll,
  release, let run out, take over;
- locks.py: row locks in the one lock order, and the errors of a lost race;
- rows.py, clock.py: rows to statement values and back; the database's time.
"""

from __future__ import annotations

from .clock import database_now
from .leases import (
    Claimed,
    Earlier,
    claim,
    earlier_history,
    earlier_version,
    expire_lease,
    following_runs,
    poll_cancel,
    release_lease,
    renew_lease,
    take_lease,
)
from .locks import (
    connection_lost,
    lock_active_runs,
    lock_call,
    lock_conversation,
    lock_run,
    lost_race,
    sqlstate,
)
from .writes import FENCE_CONSTRAINT, Event, Lease, Write, refused, send

__all__ = [
    "FENCE_CONSTRAINT",
    "Claimed",
    "Earlier",
    "Event",
    "Lease",
    "Write",
    "claim",
    "connection_lost",
    "database_now",
    "earlier_history",
    "earlier_version",
    "expire_lease",
    "following_runs",
    "lock_active_runs",
    "lock_call",
    "lock_conversation",
    "lock_run",
    "lost_race",
    "poll_cancel",
    "refused",
    "release_lease",
    "renew_lease",
    "send",
    "sqlstate",
    "take_lease",
]
