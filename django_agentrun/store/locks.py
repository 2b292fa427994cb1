"""Row locks, taken in one order by every path that locks more than one row, and the
database errors that a lost race can still raise (docs/explanation/durability.md, "Lock order").

THE LOCK ORDER: conversation -> its runs (by conversation_position) -> one run -> its turns
-> its tool calls. A path locks a parent before any of its children and never waits for a
parent while holding a child. The run is the gate: every change of a turn or tool call
(the worker's write statement in queries.sql, a person's decision, a cancel, the reaper)
is made holding its run's lock, so two of them never meet on the children in another
order.

Every lock here is `FOR NO KEY UPDATE`: these paths update rows but never their keys, and
`FOR NO KEY UPDATE` does not conflict with the `FOR KEY SHARE` that Postgres takes on a
parent row to check a foreign key (a new run of the conversation, a new event of the run),
where `FOR UPDATE` would make that insert wait for the lock's holder.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError

from ..failpoints import point
from ..models import Conversation, Run, ToolCall
from .backend import chosen

# SQLSTATEs of a transaction Postgres rolled back to settle a race: retrying it is safe.
DEADLOCK = "40P01"  # deadlock_detected
SERIALIZATION = "40001"  # serialization_failure
LOCK_TIMEOUT = "55P03"  # lock_not_available (lock_timeout set by the host)
LOST_RACE = frozenset({DEADLOCK, SERIALIZATION, LOCK_TIMEOUT})


def lock_conversation(pk: Any) -> Conversation:
    """The conversation's row (first in the order)."""
    point("lock.conversation")
    return Conversation.objects.select_for_update(no_key=True).get(pk=pk)


def lock_active_runs(conversation: Conversation, states: Any) -> list[Run]:
    """A conversation's runs in `states`, locked in conversation_position order (the
    conversation's row is held by the caller)."""
    runs = conversation.runs.filter(state__in=states).order_by("conversation_position")
    return list(runs.select_for_update(no_key=True))


def lock_run(pk: Any) -> Run:
    """A run's row: held while its turns and tool calls change."""
    point("lock.run")
    return Run.objects.select_for_update(no_key=True).get(pk=pk)


def lock_call(pk: Any) -> tuple[ToolCall, Run]:
    """A tool call and its run: the run's row first, then the call's (its turn is read,
    not locked)."""
    run_id = ToolCall.objects.filter(pk=pk).values_list("run_id", flat=True).first()
    if run_id is None:
        raise ToolCall.DoesNotExist(f"Tool call {pk} does not exist.")
    run = lock_run(run_id)
    call = (
        ToolCall.objects.select_for_update(no_key=True, of=("self",))
        .select_related("turn")
        .get(pk=pk)
    )
    return call, run


def lock_batch(queryset: Any, batch: int) -> list[Any]:
    """Up to `batch` rows of `queryset` (the reaper's runs), locked first, skipping those a
    worker or a person holds, where the database can (SQLite takes none: it has one writer)."""
    return chosen().lock_batch(queryset, batch)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg 3 `sqlstate`, psycopg2 `pgcode`)."""
    for err in (exc, exc.__cause__):
        code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if code:
            return str(code)
    return None


def lost_race(exc: BaseException) -> bool:
    """A deadlock, serialization failure or lock timeout: the database rolled the
    transaction back and a new attempt may succeed."""
    return isinstance(exc, DatabaseError) and sqlstate(exc) in LOST_RACE


def connection_lost(exc: BaseException) -> bool:
    """The connection broke (no SQLSTATE): whether the statement committed is not known."""
    return isinstance(exc, InterfaceError | OperationalError) and sqlstate(exc) is None
