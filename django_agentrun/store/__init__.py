"""The store: every statement the engine and the reaper send by hand, and the one piece of
code that sends them. No policy, no Celery.

- queries.sql / sql.py: the statements, complete and by name;
- backend.py: the one interface (`Store`) and its choice per database alias, once;
  postgres.py (the named statements; a write as one statement) and portable.py (the same
  through the ORM, SQLite) implement it; `send` sends a write through it;
- writes.py: a write (what one commit changes);
- leases.py: claim (with the history; a follow-up's earlier runs' too), renew, poll,
  release, let run out, take over;
- locks.py: row locks in the one lock order, and the errors of a lost race;
- holds.py: a released lease held back for a while (a rate limit's wait);
- caps.py: the runs worked at once under a cap, counted at the claim;
- outbox.py: the webhook deliveries a write calls for, in its transaction (both stores);
- rows.py, clock.py: rows back from statements; the database's time.
"""

from __future__ import annotations

from .backend import Store, chosen, send
from .caps import claimable, next_waiting, over_cap
from .clock import database_now
from .holds import hold_released
from .leases import (
    Claimed,
    Earlier,
    cancel_request,
    claim,
    earlier_history,
    earlier_version,
    expire_lease,
    following_runs,
    poll_cancel,
    release_lease,
    renew_lease,
    reread,
    take_lease,
)
from .locks import (
    connection_lost,
    lock_active_runs,
    lock_batch,
    lock_call,
    lock_conversation,
    lock_run,
    lost_race,
    sqlstate,
)
from .postgres import FENCE_CONSTRAINT
from .writes import Event, Lease, Share, Write, placed, refused

__all__ = [
    "FENCE_CONSTRAINT",
    "Claimed",
    "Earlier",
    "Event",
    "Lease",
    "Share",
    "Store",
    "Write",
    "cancel_request",
    "chosen",
    "claim",
    "reread",
    "claimable",
    "connection_lost",
    "database_now",
    "earlier_history",
    "earlier_version",
    "expire_lease",
    "following_runs",
    "hold_released",
    "lock_active_runs",
    "lock_batch",
    "lock_call",
    "lock_conversation",
    "lock_run",
    "lost_race",
    "next_waiting",
    "over_cap",
    "placed",
    "poll_cancel",
    "refused",
    "release_lease",
    "renew_lease",
    "send",
    "sqlstate",
    "take_lease",
]
