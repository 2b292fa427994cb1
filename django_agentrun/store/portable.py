"""The store anywhere else (SQLite): the statements of queries.sql through the ORM, leases
set and judged by the app's clock (SQLite runs on the app's host), and a write sent as a
few ORM statements in one transaction (`transaction.atomic()`): all or nothing too."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import ExpressionWrapper, F, IntegerField, Q, Subquery
from django.utils import timezone

from ..conf import agentrun_settings
from ..models import Run, RunEventRow, ToolCall, Turn
from ..states import RUN_CLAIMABLE
from . import outbox
from .rows import Result, orm_rows
from .writes import Lease, Share, Write, placed_in, refused, sent, settle

# The columns of an earlier run of a conversation that a follow-up's history reads.
EARLIER_RUN_FIELDS = ("id", "conversation_position", "input", "context", "state", "last_seq")


class PortableStore:
    """The store (backend.Store) through the ORM."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor

    # -- leases ---------------------------------------------------------------------------

    def claim(
        self,
        run_id: Any,
        owner: str,
        name: str,
        dead_holder: str | None,
        history: bool,
        seconds: float,
    ) -> list[Result]:
        """The claim statements of queries.sql (`claim_released`, `claim_takeover`)."""
        now = timezone.now()
        rows = Run._base_manager.filter(pk=run_id, state__in=RUN_CLAIMABLE)
        fields: dict[str, Any] = {
            "lease_owner": owner,
            "lease_expires_at": now + timedelta(seconds=seconds),
            "lease_epoch": F("lease_epoch") + 1,
            "updated_at": now,
        }
        if name == "claim_released":
            # Not while an earlier run of its conversation is active (queries.sql).
            rows = Run.objects.filter(
                pk=run_id, state__in=RUN_CLAIMABLE, lease_owner=""
            ).startable()
        else:
            expired = Q(lease_expires_at__lt=now)
            if dead_holder:
                expired |= Q(lease_owner=dead_holder)
            rows = rows.exclude(lease_owner="").filter(expired)
            fields["recovery_attempts"] = F("recovery_attempts") + 1
        if not rows.update(**fields):
            return [((), [])]
        results = [orm_rows(Run._base_manager.filter(pk=run_id))]
        if history:
            results.append(orm_rows(Turn._base_manager.filter(run_id=run_id).order_by("index")))
            results.append(
                orm_rows(
                    ToolCall._base_manager.filter(run_id=run_id).order_by("turn_index", "position")
                )
            )
        return results

    def earlier(self, conversation_id: Any, position: int) -> list[Result]:
        runs = Run._base_manager.filter(
            conversation_id=conversation_id, conversation_position__lt=position, rolled_back=False
        )
        return [
            orm_rows(runs.order_by("conversation_position"), EARLIER_RUN_FIELDS),
            orm_rows(
                Turn._base_manager.filter(run__in=runs).order_by(
                    "run__conversation_position", "index"
                )
            ),
            orm_rows(
                ToolCall._base_manager.filter(run__in=runs).order_by(
                    "run__conversation_position", "turn_index", "position"
                )
            ),
        ]

    def take_lease(self, run: Run, owner: str, seconds: float) -> tuple[int, datetime]:
        epoch, expires_at = run.lease_epoch + 1, timezone.now() + timedelta(seconds=seconds)
        Run._base_manager.filter(pk=run.pk).update(
            lease_owner=owner, lease_expires_at=expires_at, lease_epoch=epoch
        )
        return epoch, expires_at

    def release_lease(self, lease: Lease) -> bool:
        return _fenced(lease).update(lease_owner="", lease_expires_at=timezone.now()) == 1

    def expire_lease(self, lease: Lease) -> bool:
        # The epoch moves on: a renewal still on its way finds nothing (queries.sql).
        expired = {"lease_expires_at": timezone.now(), "lease_epoch": F("lease_epoch") + 1}
        return _fenced(lease).update(**expired) == 1

    def renew_lease(self, lease: Lease) -> tuple[bool, bool]:
        expires = timezone.now() + timedelta(seconds=agentrun_settings.LEASE_SECONDS)
        if not _fenced(lease).update(lease_expires_at=expires):
            return False, False
        cancel = Run._base_manager.filter(pk=lease.run_id).values_list(
            "cancel_requested_at", flat=True
        )
        return True, cancel.get() is not None

    def poll_cancel(self, run_id: Any) -> tuple | None:
        return (
            Run._base_manager.filter(pk=run_id)
            .values_list("lease_epoch", "lease_owner", "cancel_requested_at")
            .first()
        )

    # -- time and locks -------------------------------------------------------------------

    def now(self) -> datetime:
        return timezone.now()

    def over_cap(self, run_id: Any, shares: list[Share]) -> Share | None:
        # No lock: SQLite has one writer, and the claim that follows is a write.
        worked = (
            Run.objects.leased().filter(lease_expires_at__gt=timezone.now()).exclude(lease_owner="")
        )
        for share in shares:
            column, value, cap = share
            if worked.filter(**{column: value}).exclude(pk=run_id).count() >= cap:
                return share
        return None

    def lock_batch(self, queryset: Any, batch: int) -> list[Any]:
        if connection.features.has_select_for_update_skip_locked:
            queryset = queryset.select_for_update(skip_locked=True, no_key=True)
        return list(queryset[:batch])

    # -- a write: a few ORM statements in one transaction ---------------------------------

    def send(self, write: Write, *, savepoint: bool = False) -> None:
        # Always in a savepoint of its own inside a caller's transaction (`savepoint`).
        deliveries = None
        for kind, _ in write.events:  # inline: a write reporting nothing calls nothing more
            if kind in outbox.EVENTS:
                deliveries = outbox.wanted(write)
                break
        with transaction.atomic():
            _send(write)
            if deliveries:
                outbox.insert(write, deliveries)
        sent(write)


def _fenced(lease: Lease) -> Any:
    return Run._base_manager.filter(
        pk=lease.run_id, lease_epoch=lease.epoch, lease_owner=lease.owner
    )


def _send(write: Write) -> None:
    run = write.run
    placed = placed_in(write)
    # A value its event holds is not copied into the row (models/recorded.py): the row
    # takes the seq its event will take, the run's last_seq before this write (read in the
    # same UPDATE: the write holds SQLite's one write lock from its first statement) plus
    # the event's place; a row added takes it once the run's UPDATE has told it.
    held = {id(p.obj): p for p in placed}
    before = Subquery(Run._base_manager.filter(pk=run.pk).values("last_seq")[:1])
    for change in write.changed:
        model = type(change.obj)
        rows = model._base_manager.filter(pk=change.obj.pk)
        if change.expected is not None:
            rows = rows.filter(state=change.expected)
        fields = dict(change.fields)
        found = held.get(id(change.obj))
        if found is not None:
            fields[found.spec.attr] = None
            fields[found.spec.seq_field] = ExpressionWrapper(
                before + found.place + 1, output_field=IntegerField()
            )
        if rows.update(**fields) != 1:
            refused(write)
    target = Run._base_manager.filter(pk=run.pk)
    if write.expected_state is not None:
        target = target.filter(state=write.expected_state)
    if write.lease is not None:
        target = target.filter(lease_epoch=write.lease.epoch, lease_owner=write.lease.owner)
    fields: dict[str, Any] = dict(write.run_fields)
    now = timezone.now()
    if write.lease_change == "now":
        fields["lease_expires_at"] = now
    elif write.lease_change == "renew":
        fields["lease_expires_at"] = now + timedelta(seconds=agentrun_settings.LEASE_SECONDS)
    for name, delta in write.counters.items():
        fields[name] = F(name) + delta
    fields["last_seq"] = F("last_seq") + len(write.events)
    fields["updated_at"] = now
    if target.update(**fields) != 1:
        refused(write)
    last_seq, cancel_at = (
        Run._base_manager.filter(pk=run.pk).values_list("last_seq", "cancel_requested_at").get()
    )
    first = last_seq - len(write.events) + 1
    try:
        for p in placed:
            setattr(p.obj, p.spec.seq_field, first + p.place)
        for obj in write.added:
            if isinstance(obj, Turn):
                obj.save(force_insert=True)
        for obj in write.added:
            if isinstance(obj, ToolCall):
                if obj.turn_id is None:
                    obj.turn_id = obj.turn.pk
                obj.save(force_insert=True)
        if write.events:
            RunEventRow(
                run_id=run.pk,
                seq=first,
                seq_to=last_seq,
                events=[[kind, data] for kind, data in write.events],
                created_at=now,
            ).save(force_insert=True)
    except BaseException:
        for p in placed:  # rolled back: no event holds the value (a retry places it again)
            setattr(p.obj, p.spec.seq_field, None)
        raise
    settle(write, last_seq, cancel_at is not None, placed)
