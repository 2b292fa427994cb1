"""Leases: claim a run (and read its history in the same round trip), renew, poll,
release, let run out, and the reaper's take-over. On Postgres expiry is set and judged by
the database's clock (queries.sql); elsewhere by the app's, through the ORM."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import F, Q
from django.utils import timezone

from ..conf import agentrun_settings
from ..models import Run, ToolCall, Turn
from ..states import RunState
from .rows import column_names, instances
from .sql import sql
from .writes import Lease

logger = logging.getLogger(__name__)

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


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def claim(
    run_id: Any, owner: str, *, steal_from: str | None = None, history: bool = True
) -> Claimed | None:
    """Take the run's lease, bumping its epoch. A released lease first (the usual case, no
    recovery counted); only if there is none, the lease of a holder that never released it:
    expired by the database's clock, or `steal_from` (a holder known to be dead), counting
    a recovery. None: another live holder, or nothing to advance."""
    if not steal_from:
        claimed = _claim(run_id, owner, "claim_released", None, history)
        if claimed is not None:
            return claimed
    return _claim(run_id, owner, "claim_takeover", steal_from, history)


def _claim(
    run_id: Any, owner: str, name: str, dead_holder: str | None, history: bool
) -> Claimed | None:
    started = time.monotonic()  # before the statement: the lease is valid no longer than this
    seconds = agentrun_settings.LEASE_SECONDS
    if _postgres():
        params = {
            "run_id": run_id,
            "owner": owner,
            "lease_seconds": float(seconds),
            "dead_holder": dead_holder,
        }
        statements = [sql(name)]
        if history:
            statements += [sql("select_turns"), sql("select_tool_calls")]
        results = _execute_many(statements, params)
    else:
        results = _claim_portable(run_id, owner, name, dead_holder, history, seconds)
    run_names, run_rows = results[0]
    if not run_rows:
        return None
    run = instances(Run, run_names, run_rows)[0]
    turns = instances(Turn, *results[1]) if history else []
    calls = instances(ToolCall, *results[2]) if history else []
    lease = Lease(run.pk, owner, run.lease_epoch, valid_until=started + seconds)
    return Claimed(lease, run, turns, calls, took_over=name == "claim_takeover")


Result = tuple[tuple[str, ...], list[tuple]]


def _execute_many(statements: list[str], params: dict[str, Any]) -> list[Result]:
    """Statements that return rows; one round trip where the driver allows several
    statements in one query."""
    with connection.cursor() as cursor:
        if len(statements) > 1 and _multi_statement(cursor):
            cursor.execute(";\n".join(statements), params)
            results = [(column_names(cursor), cursor.fetchall())]
            for _ in statements[1:]:
                cursor.nextset()
                results.append((column_names(cursor), cursor.fetchall()))
            return results
        results = []
        for text in statements:
            cursor.execute(text, params)
            results.append((column_names(cursor), cursor.fetchall()))
        return results


def _multi_statement(cursor: Any) -> bool:
    """Several statements with their results in one query: psycopg 3's client-side binding
    cursor only (psycopg2 returns the last statement's rows only; psycopg 3's server-side
    binding refuses several statements). Never imports a driver the project does not use."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(cursor.cursor, psycopg.ClientCursor)


def _claim_portable(
    run_id: Any, owner: str, name: str, dead_holder: str | None, history: bool, seconds: float
) -> list[Result]:
    """The claim statements of queries.sql, through the ORM (the app's clock)."""
    now = timezone.now()
    rows = Run._base_manager.filter(pk=run_id, state__in=CLAIMABLE)
    fields: dict[str, Any] = {
        "lease_owner": owner,
        "lease_expires_at": now + timedelta(seconds=seconds),
        "lease_epoch": F("lease_epoch") + 1,
        "updated_at": now,
    }
    if name == "claim_released":
        # Not while an earlier run of its conversation is active (queries.sql).
        rows = Run.objects.filter(pk=run_id, state__in=CLAIMABLE, lease_owner="").startable()
    else:
        expired = Q(lease_expires_at__lt=now)
        if dead_holder:
            expired |= Q(lease_owner=dead_holder)
        rows = rows.exclude(lease_owner="").filter(expired)
        fields["recovery_attempts"] = F("recovery_attempts") + 1
    if not rows.update(**fields):
        return [((), [])]
    results = [_orm_rows(Run._base_manager.filter(pk=run_id))]
    if history:
        results.append(_orm_rows(Turn._base_manager.filter(run_id=run_id).order_by("index")))
        results.append(
            _orm_rows(
                ToolCall._base_manager.filter(run_id=run_id).order_by("turn_index", "position")
            )
        )
    return results


def _orm_rows(queryset: Any, only: tuple[str, ...] | None = None) -> Result:
    fields = [f for f in queryset.model._meta.concrete_fields if only is None or f.name in only]
    names = tuple(f.column for f in fields)
    sql_text, params = queryset.values_list(*(f.attname for f in fields)).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql_text, params)
        return names, cursor.fetchall()


@dataclass
class Earlier:
    """The runs of a conversation before a follow-up that its history holds (in order, not
    rolled back; only `id`, `conversation_position`, `input`, `context`, `state` and
    `last_seq` read),
    with their turns and tool calls (in order)."""

    runs: list[Run]
    turns: list[Turn]
    calls: list[ToolCall]


def earlier_history(run: Run) -> Earlier:
    """What the history of `run`, a run of a conversation, starts with: the earlier runs'
    rows, read when its task claims it (one round trip where the driver allows)."""
    if run.conversation_id is None or not run.conversation_position:
        return Earlier([], [], [])
    params = {"conversation_id": run.conversation_id, "position": run.conversation_position}
    if _postgres():
        names = ("select_earlier_runs", "select_earlier_turns", "select_earlier_tool_calls")
        results = _execute_many([sql(name) for name in names], params)
    else:
        runs = Run._base_manager.filter(
            conversation_id=run.conversation_id,
            conversation_position__lt=run.conversation_position,
            rolled_back=False,
        )
        results = [
            _orm_rows(runs.order_by("conversation_position"), EARLIER_RUN_FIELDS),
            _orm_rows(
                Turn._base_manager.filter(run__in=runs).order_by(
                    "run__conversation_position", "index"
                )
            ),
            _orm_rows(
                ToolCall._base_manager.filter(run__in=runs).order_by(
                    "run__conversation_position", "turn_index", "position"
                )
            ),
        ]
    return Earlier(
        instances(Run, *results[0]), instances(Turn, *results[1]), instances(ToolCall, *results[2])
    )


EARLIER_RUN_FIELDS = ("id", "conversation_position", "input", "context", "state", "last_seq")


def earlier_version(run: Run) -> list[tuple[Any, int]]:
    """Each earlier run of `run`'s conversation that its history holds, with its last
    event's seq: a replaced tool result (or a rollback) there changes it. One indexed read,
    made before each turn of a follow-up after its first (engine/claim.new_turn)."""
    return list(
        Run._base_manager.filter(
            conversation_id=run.conversation_id,
            conversation_position__lt=run.conversation_position,
            rolled_back=False,
        )
        .order_by("conversation_position")
        .values_list("id", "last_seq")
    )


def following_runs(run: Run) -> list[Any]:
    """The next queued run of `run`'s conversation (a list of at most one id): the run its
    claim held back while `run` was active, to wake once `run` has ended. Empty when the
    database cannot say: the reaper wakes a queued run nothing holds back."""
    try:
        found = (
            Run._base_manager.filter(
                conversation_id=run.conversation_id,
                conversation_position__gt=run.conversation_position,
                state=RunState.QUEUED,
            )
            .order_by("conversation_position")
            .values_list("pk", flat=True)
            .first()
        )
    except DatabaseError:
        logger.warning("Could not look for a follow-up of run_id=%s", run.pk, exc_info=True)
        return []
    return [] if found is None else [found]


def take_lease(run: Run, owner: str, *, seconds: float | None = None) -> Lease:
    """Take the lease of a run whose row the caller holds locked (the reaper), fencing out
    any previous holder by bumping the epoch."""
    started = time.monotonic()
    seconds = agentrun_settings.LEASE_SECONDS if seconds is None else seconds
    if _postgres():
        with connection.cursor() as cursor:
            cursor.execute(
                sql("take_lease"),
                {"owner": owner, "lease_seconds": float(seconds), "run_id": run.pk},
            )
            epoch, expires_at = cursor.fetchone()
    else:
        epoch, expires_at = run.lease_epoch + 1, timezone.now() + timedelta(seconds=seconds)
        Run._base_manager.filter(pk=run.pk).update(
            lease_owner=owner, lease_expires_at=expires_at, lease_epoch=epoch
        )
    run.lease_owner, run.lease_epoch, run.lease_expires_at = owner, epoch, expires_at
    return Lease(run.pk, owner, epoch, valid_until=started + seconds)


def _fenced(lease: Lease) -> Any:
    return Run._base_manager.filter(
        pk=lease.run_id, lease_epoch=lease.epoch, lease_owner=lease.owner
    )


def _lease_params(lease: Lease) -> dict[str, Any]:
    return {"run_id": lease.run_id, "epoch": lease.epoch, "owner": lease.owner}


def release_lease(lease: Lease) -> bool:
    """Give the lease back (best effort; an expired lease is harmless). Whether it was held.
    A released lease keeps the time (the database's): a run nobody claims since then lost
    its wake-up (the reaper)."""
    if not _postgres():
        return _fenced(lease).update(lease_owner="", lease_expires_at=timezone.now()) == 1
    with connection.cursor() as cursor:
        cursor.execute(sql("release_lease"), _lease_params(lease))
        return cursor.rowcount == 1


def expire_lease(lease: Lease) -> bool:
    """Let the lease run out now, keeping its owner: the next claim takes it over and counts
    a recovery (for a step stopped because its lease could not be renewed)."""
    if not _postgres():
        return _fenced(lease).update(lease_expires_at=timezone.now()) == 1
    with connection.cursor() as cursor:
        cursor.execute(sql("expire_lease"), _lease_params(lease))
        return cursor.rowcount == 1


def renew_lease(lease: Lease) -> tuple[bool, bool]:
    """Extend the lease; (still held, cancel requested)."""
    if not _postgres():
        expires = timezone.now() + timedelta(seconds=agentrun_settings.LEASE_SECONDS)
        if not _fenced(lease).update(lease_expires_at=expires):
            return False, False
        cancel = Run._base_manager.filter(pk=lease.run_id).values_list(
            "cancel_requested_at", flat=True
        )
        return True, cancel.get() is not None
    params = {**_lease_params(lease), "lease_seconds": float(agentrun_settings.LEASE_SECONDS)}
    with connection.cursor() as cursor:
        cursor.execute(sql("renew_lease"), params)
        row = cursor.fetchone()
    if row is None:
        return False, False
    return True, row[0] is not None


def poll_cancel(lease: Lease) -> tuple[bool, bool]:
    """A cheap read: (still held, cancel requested)."""
    if not _postgres():
        row = (
            Run._base_manager.filter(pk=lease.run_id)
            .values_list("lease_epoch", "lease_owner", "cancel_requested_at")
            .first()
        )
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql("poll_cancel"), {"run_id": lease.run_id})
            row = cursor.fetchone()
    if row is None:
        return False, False
    return (row[0] == lease.epoch and row[1] == lease.owner), row[2] is not None
