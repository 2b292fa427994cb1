"""Leases: claim a run (and read its history in the same round trip), renew, poll,
release, let run out, and the reaper's take-over; a follow-up's earlier runs. Each through
the chosen store (backend.py): on Postgres expiry is set and judged by the database's clock
(queries.sql); elsewhere by the app's, through the ORM."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from ..conf import agentrun_settings
from ..models import Run, ToolCall, Turn
from ..states import RunState
from .backend import chosen
from .rows import instances
from .writes import Lease

logger = logging.getLogger(__name__)


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
        claimed = _claim(run_id, owner, "claim_released", None, history)
        if claimed is not None:
            return claimed
    return _claim(run_id, owner, "claim_takeover", steal_from, history)


def _claim(
    run_id: Any, owner: str, name: str, dead_holder: str | None, history: bool
) -> Claimed | None:
    started = time.monotonic()  # before the statement: the lease is valid no longer than this
    seconds = agentrun_settings.LEASE_SECONDS
    results = chosen().claim(run_id, owner, name, dead_holder, history, seconds)
    run_names, run_rows = results[0]
    if not run_rows:
        return None
    run = instances(Run, run_names, run_rows)[0]
    turns = instances(Turn, *results[1]) if history else []
    calls = instances(ToolCall, *results[2]) if history else []
    lease = Lease(run.pk, owner, run.lease_epoch, valid_until=started + seconds)
    return Claimed(lease, run, turns, calls, took_over=name == "claim_takeover")


def reread(lease: Lease) -> Claimed | None:
    """The run's row, turns and tool calls as they are now, if `lease` still holds it (its
    holder's commit was refused because a late result closed one of its calls meanwhile:
    engine/driver.py); None when it does not. Plain reads: a write sent after them is
    refused again if anything changed meanwhile."""
    run = Run.objects.filter(pk=lease.run_id, lease_owner=lease.owner, lease_epoch=lease.epoch)
    found = run.first()
    if found is None or found.state not in (RunState.RUNNING, RunState.AWAITING_TOOL):
        return None
    turns = list(Turn.objects.filter(run_id=found.pk).order_by("index"))
    calls = list(ToolCall.objects.filter(run_id=found.pk).order_by("turn_index", "position"))
    return Claimed(lease, found, turns, calls)


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
    results = chosen().earlier(run.conversation_id, run.conversation_position)
    return Earlier(
        instances(Run, *results[0]), instances(Turn, *results[1]), instances(ToolCall, *results[2])
    )


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
    epoch, expires_at = chosen().take_lease(run, owner, seconds)
    run.lease_owner, run.lease_epoch, run.lease_expires_at = owner, epoch, expires_at
    return Lease(run.pk, owner, epoch, valid_until=started + seconds)


def release_lease(lease: Lease) -> bool:
    """Give the lease back (best effort; an expired lease is harmless). Whether it was held.
    A released lease keeps the time (the database's): a run nobody claims since then lost
    its wake-up (the reaper)."""
    return chosen().release_lease(lease)


def expire_lease(lease: Lease) -> bool:
    """Let the lease run out now, keeping its owner: the next claim takes it over and counts
    a recovery (for a step stopped because its lease could not be renewed). Its epoch moves
    on: nothing of this holder's, a renewal on its way included, changes the run after it."""
    return chosen().expire_lease(lease)


def renew_lease(lease: Lease) -> tuple[bool, bool]:
    """Extend the lease; (still held, cancel requested)."""
    return chosen().renew_lease(lease)


def cancel_request(run_id: Any) -> tuple[Any, str] | None:
    """The run's cancel request (when, why), read afresh; None: there is none."""
    found = Run.objects.filter(pk=run_id).values_list("cancel_requested_at", "cancel_reason")
    row = found.first()
    return row if row is not None and row[0] is not None else None


def poll_cancel(lease: Lease) -> tuple[bool, bool]:
    """A cheap read: (still held, cancel requested)."""
    row = chosen().poll_cancel(lease.run_id)
    if row is None:
        return False, False
    return (row[0] == lease.epoch and row[1] == lease.owner), row[2] is not None
