"""Leases: claim a run (and read its history in the same round trip), renew, poll, release,
and the reaper's take-over. Expiry is set and judged by the database's clock."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from ..conf import agentrun_settings
from ..models import Run, ToolCall, Turn
from ..states import RunState
from .clock import clock, db_value
from .rows import columns, instances
from .runs import Lease
from .sql import sql

CLAIMABLE = (RunState.QUEUED, RunState.RUNNING, RunState.AWAITING_TOOL)


@dataclass
class Claimed:
    """What a claim returns: the lease, the run row, and its turns and tool calls (in
    order), read in the same round trip; `took_over`: from a holder that never released it."""

    lease: Lease
    run: Run
    turns: list[Turn]
    calls: list[ToolCall]
    took_over: bool = False


def claim(
    run_id: Any, owner: str, *, steal_from: str | None = None, history: bool = True
) -> Claimed | None:
    """Take the run's lease, bumping its epoch. A released lease first (the usual case, no
    recovery counted); only if there is none, the lease of a holder that never released it:
    expired by the database's clock, or `steal_from` (a holder known to be dead), counting
    a recovery. None: another live holder, or nothing to advance."""
    if not steal_from:
        claimed = _claim(run_id, owner, None, history)
        if claimed is not None:
            return claimed
    return _claim(run_id, owner, steal_from or "", history)


def _claim(run_id: Any, owner: str, takeover: str | None, history: bool) -> Claimed | None:
    """takeover None: a released lease; "" an expired one; a name: that holder's too."""
    started = time.monotonic()  # before the statement: the lease is valid no longer than this
    expires, expires_params = clock(agentrun_settings.LEASE_SECONDS)
    params: list[Any] = [
        owner,
        *expires_params,
        db_value(Run, "updated_at", timezone.now()),
        db_value(Run, "id", run_id),
        *CLAIMABLE,
    ]
    if takeover is None:
        statement = sql("claim_released", expires=expires, run_columns=columns(Run))
    else:
        now, now_params = clock()
        params += now_params
        steal = ""
        if takeover:
            steal = sql("steal")
            params.append(takeover)
        statement = sql(
            "claim_takeover", expires=expires, now=now, or_steal=steal, run_columns=columns(Run)
        )
    statements = [(statement, params)]
    if history:
        run_db = db_value(Run, "id", run_id)
        statements += [
            (sql("select_turns", turn_columns=columns(Turn)), [run_db]),
            (sql("select_tool_calls", call_columns=columns(ToolCall)), [run_db]),
        ]
    results = _execute_many(statements)
    if not results[0]:
        return None
    run = instances(Run, results[0])[0]
    turns = instances(Turn, results[1]) if history else []
    calls = instances(ToolCall, results[2]) if history else []
    lease = Lease(
        run_id=run.pk,
        owner=owner,
        epoch=run.lease_epoch,
        valid_until=started + agentrun_settings.LEASE_SECONDS,
    )
    return Claimed(lease, run, turns, calls, took_over=takeover is not None)


def _execute_many(statements: list[tuple[str, list[Any]]]) -> list[list[tuple]]:
    """Run statements that return rows; one round trip where the driver allows several
    statements in one query."""
    with connection.cursor() as cursor:
        if len(statements) > 1 and _multi_statement(cursor):
            cursor.execute(
                "; ".join(text for text, _ in statements), [p for _, ps in statements for p in ps]
            )
            results = [cursor.fetchall()]
            for _ in statements[1:]:
                cursor.nextset()
                results.append(cursor.fetchall())
            return results
        results = []
        for text, params in statements:
            cursor.execute(text, params)
            results.append(cursor.fetchall())
        return results


def _multi_statement(cursor: Any) -> bool:
    """Several statements with their results in one query: psycopg 3's client-side binding
    cursor only (psycopg2 returns the last statement's rows only; psycopg 3's server-side
    binding refuses several statements). Never imports a driver the project does not use."""
    psycopg = sys.modules.get("psycopg")
    return (
        connection.vendor == "postgresql"
        and psycopg is not None
        and isinstance(cursor.cursor, psycopg.ClientCursor)
    )


def take_lease(run: Run, owner: str, *, seconds: float | None = None) -> Lease:
    """Take the lease of a run whose row the caller holds locked (the reaper), fencing out
    any previous holder by bumping the epoch."""
    started = time.monotonic()
    seconds = agentrun_settings.LEASE_SECONDS if seconds is None else seconds
    expires, expires_params = clock(seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            sql("take_lease", expires=expires),
            [owner, *expires_params, run.lease_epoch + 1, db_value(Run, "id", run.pk)],
        )
        expires_at = cursor.fetchone()[0]
    run.lease_owner, run.lease_epoch = owner, run.lease_epoch + 1
    run.lease_expires_at = expires_at if isinstance(expires_at, datetime) else timezone.now()
    return Lease(run.pk, owner, run.lease_epoch, valid_until=started + seconds)


def release_lease(lease: Lease) -> bool:
    """Give the lease back (best effort; an expired lease is harmless). Whether it was held.
    A released lease keeps the time (the database's): a run nobody claims since then lost
    its wake-up (the reaper)."""
    now, now_params = clock()
    with connection.cursor() as cursor:
        cursor.execute(
            sql("release_lease", now=now),
            [*now_params, db_value(Run, "id", lease.run_id), lease.epoch, lease.owner],
        )
        return cursor.rowcount == 1


def renew_lease(lease: Lease) -> tuple[bool, bool]:
    """Extend the lease; (still held, cancel requested)."""
    expires, expires_params = clock(agentrun_settings.LEASE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            sql("renew_lease", expires=expires),
            [*expires_params, db_value(Run, "id", lease.run_id), lease.epoch, lease.owner],
        )
        row = cursor.fetchone()
    if row is None:
        return False, False
    return True, row[0] is not None


def poll_cancel(lease: Lease) -> tuple[bool, bool]:
    """A cheap read: (still held, cancel requested)."""
    with connection.cursor() as cursor:
        cursor.execute(sql("poll_cancel"), [db_value(Run, "id", lease.run_id)])
        row = cursor.fetchone()
    if row is None:
        return False, False
    return (row[0] == lease.epoch and row[1] == lease.owner), row[2] is not None
