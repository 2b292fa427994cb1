"""A write: what one commit changes, built by the transitions and sent by `send` as a whole.

- the run's compare-and-set change: its new column values, counters to add to, the
  state it is expected to be in, and the lease that fences it;
- the turns and tool calls it adds, and those it changes (each expected in the state it
  was read in);
- its events (their seqs come from the run's `last_seq`), and what to do after the commit.

On Postgres `send` sends it as one statement (queries.sql `write`): alone in autocommit it
is its own transaction, all or nothing; inside a caller's transaction it is one more
statement of it. Elsewhere it is a few ORM statements in `transaction.atomic()`. A refused
write changes nothing and raises LeaseLost or ConcurrentUpdate (`refused`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from .. import streams
from ..conf import agentrun_settings
from ..exceptions import ConcurrentUpdate, LeaseLost
from ..models import Run, RunEvent, ToolCall, Turn
from .rows import changes_values, dumps, row_values
from .sql import sql

Event = tuple[str, dict[str, Any]]

# A lone write that is refused fails on this constraint (unique run + seq; the run's
# first event already has seq 1): see `write` in queries.sql. A test checks the schema
# still has it.
FENCE_CONSTRAINT = "agentrun_runevent_seq"

COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "cost_usd",
    "turn_count",
)

LeaseChange = Literal["keep", "now", "renew"]


@dataclass(frozen=True)
class Lease:
    """Proof that this worker may advance the run: its owner string and the epoch it
    claimed. `valid_until` (time.monotonic()) is when it runs out at the latest, taken
    before the claim was sent: the holder must stop executing before then unless renewed."""

    run_id: uuid.UUID
    owner: str
    epoch: int
    valid_until: float = float("inf")


@dataclass
class Change:
    """One turn or tool call to change: `obj` already holds the new values."""

    obj: Any
    expected: str | None
    fields: dict[str, Any]


@dataclass
class Write:
    """What one commit changes (see the module's docstring). Built by transitions.py."""

    run: Run
    lease: Lease | None = None
    expected_state: str | None = None
    run_fields: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    lease_change: LeaseChange = "keep"
    added: list[Any] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    after_commit: list[Callable[[], Any]] = field(default_factory=list)
    # What the commit answered:
    cancel_requested: bool = False

    # -- building (transitions.py) --------------------------------------------------------

    def set_run(self, **fields: Any) -> None:
        """New values of run columns (the instance takes them once the write is sent)."""
        self.run_fields.update(fields)

    def expect_run(self, state: str) -> None:
        """The run must still be in `state` (the first expectation of a write holds)."""
        if self.expected_state is None:
            self.expected_state = state

    def count(self, **deltas: Any) -> None:
        """Add to the run's counters (usage, cost, turns)."""
        for name, delta in deltas.items():
            self.counters[name] = self.counters.get(name, 0) + delta

    def add(self, *objs: Any) -> None:
        """New turns or tool calls (their ids are set when the write is sent)."""
        self.added.extend(objs)

    def change(self, obj: Any, expected: str | None, **fields: Any) -> None:
        """Set `fields` on a turn or tool call (it takes them at once), expected to be in
        state `expected` in the database; one added in this write is simply written as is."""
        for name, value in fields.items():
            if name != "state":  # moved already (transitions), and protected
                setattr(obj, name, value)
        if any(obj is added for added in self.added):
            return
        for existing in self.changed:
            if existing.obj is obj:
                existing.fields.update(fields)
                return
        self.changed.append(Change(obj, expected, dict(fields)))

    def record(self, event: Event) -> None:
        self.events.append(event)

    def then(self, callback: Callable[[], Any]) -> None:
        """Run `callback` after the commit (a wake-up, a signal); never if it is refused."""
        self.after_commit.append(callback)


def send(write: Write) -> Write:
    """Send `write` (see the module's docstring); its callbacks run after the commit, at
    once when it was its own transaction, else when the caller's commits."""
    if connection.vendor == "postgresql":
        if connection.in_atomic_block or write.events:
            _send_postgres(write)
        else:
            # Without an event a refusal cannot fail the statement as a whole: give it a
            # transaction of its own, which the refusal's exception rolls back.
            with transaction.atomic():
                _send_postgres(write)
    else:
        with transaction.atomic():
            _send_portable(write)
    for callback in write.after_commit:
        transaction.on_commit(callback)
    if write.events:
        streams.notify_after_commit(write.run, write.run.last_seq)
    return write


# -- Postgres: one statement -------------------------------------------------------------


def _send_postgres(write: Write) -> None:
    run = write.run
    now = timezone.now()
    turns_added = [o for o in write.added if isinstance(o, Turn)]
    calls_added = [o for o in write.added if isinstance(o, ToolCall)]
    turns_changed = [c for c in write.changed if isinstance(c.obj, Turn)]
    calls_changed = [c for c in write.changed if isinstance(c.obj, ToolCall)]
    for obj in write.added:
        if getattr(obj, "created_at", True) is None:
            obj.created_at = now
    params = {
        "run_id": run.pk,
        "expected_state": write.expected_state,
        "epoch": write.lease.epoch if write.lease else None,
        "owner": write.lease.owner if write.lease else None,
        "lease": write.lease_change,
        "lease_seconds": float(agentrun_settings.LEASE_SECONDS),
        "run_changes": dumps(changes_values(Run, write.run_fields)),
        **{name: write.counters.get(name, 0) for name in COUNTERS},
        "turns_added": dumps([row_values(t) for t in turns_added]),
        "turns_changed": dumps(_changes(Turn, turns_changed)),
        "turns_changed_count": len(turns_changed),
        "calls_added": dumps([row_values(c) for c in calls_added]),
        "calls_changed": dumps(_changes(ToolCall, calls_changed)),
        "calls_changed_count": len(calls_changed),
        "events": dumps([{"type": kind, "payload": data} for kind, data in write.events]),
        "event_count": len(write.events),
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql("write"), params)
            row = cursor.fetchone()
    except IntegrityError as exc:
        if not _fenced_out(exc):
            raise
        row = None
    if row is None:
        refused(write)
    last_seq, cancel_requested_at, _expires, turn_ids, call_ids = row
    turn_id = {index: pk for index, pk in _json(turn_ids)}
    for turn in turns_added:
        _saved(turn, turn_id[turn.index])
    call_id = {(t, p): pk for t, p, pk in _json(call_ids)}
    for call in calls_added:
        if call.turn_id is None:
            call.turn_id = turn_id[call.turn_index]
        _saved(call, call_id[(call.turn_index, call.position)])
    _sent(write, int(last_seq), cancel_requested_at is not None)


def _changes(model: type, changes: list[Change]) -> list[dict[str, Any]]:
    return [
        {"id": c.obj.pk, "expected": c.expected, "changes": changes_values(model, c.fields)}
        for c in changes
    ]


def _json(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str | bytes) else value


def _fenced_out(exc: IntegrityError) -> bool:
    """The error of a write that was refused (see FENCE_CONSTRAINT)."""
    diag = getattr(exc.__cause__, "diag", None)
    return diag is not None and diag.constraint_name == FENCE_CONSTRAINT


# -- elsewhere: the same through the ORM -------------------------------------------------


def _send_portable(write: Write) -> None:
    run = write.run
    for change in write.changed:
        model = type(change.obj)
        rows = model._base_manager.filter(pk=change.obj.pk)
        if change.expected is not None:
            rows = rows.filter(state=change.expected)
        if rows.update(**change.fields) != 1:
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
        fields["lease_expires_at"] = now + _seconds(agentrun_settings.LEASE_SECONDS)
    for name, delta in write.counters.items():
        fields[name] = F(name) + delta
    fields["last_seq"] = F("last_seq") + len(write.events)
    fields["updated_at"] = now
    if target.update(**fields) != 1:
        refused(write)
    last_seq, cancel_at = (
        Run._base_manager.filter(pk=run.pk).values_list("last_seq", "cancel_requested_at").get()
    )
    for obj in write.added:
        if isinstance(obj, Turn):
            obj.save(force_insert=True)
    for obj in write.added:
        if isinstance(obj, ToolCall):
            if obj.turn_id is None:
                obj.turn_id = obj.turn.pk
            obj.save(force_insert=True)
    first = last_seq - len(write.events) + 1
    RunEvent.objects.bulk_create(
        RunEvent(run_id=run.pk, seq=first + i, type=kind, payload=data, created_at=now)
        for i, (kind, data) in enumerate(write.events)
    )
    _sent(write, last_seq, cancel_at is not None)


def _seconds(value: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=value)


# -- after sending -----------------------------------------------------------------------


def _saved(obj: Any, pk: Any) -> None:
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = connection.alias


def _sent(write: Write, last_seq: int, cancel_requested: bool) -> None:
    """The run instance takes what was written."""
    run = write.run
    run.last_seq = last_seq
    for name, value in write.run_fields.items():
        if name != "state":
            setattr(run, name, value)
    for name, delta in write.counters.items():
        setattr(run, name, getattr(run, name) + delta)
    if write.lease_change == "now":
        run.lease_expires_at = timezone.now()
    write.cancel_requested = cancel_requested


def refused(write: Write) -> NoReturn:
    """Say which refusal a write met: LeaseLost, or ConcurrentUpdate."""
    run, lease, expected = write.run, write.lease, write.expected_state
    current = Run.objects.filter(pk=run.pk).values("state", "lease_epoch", "lease_owner").first()
    if current is None:
        raise ConcurrentUpdate(f"Run {run.pk} no longer exists")
    if lease is not None and (
        current["lease_epoch"] != lease.epoch or current["lease_owner"] != lease.owner
    ):
        raise LeaseLost(f"Run {run.pk}: lease epoch {lease.epoch} was superseded")
    if expected is None or current["state"] == expected:
        raise ConcurrentUpdate(f"Run {run.pk}: one of its turns or tool calls changed concurrently")
    raise ConcurrentUpdate(
        f"Run {run.pk} changed concurrently: expected state {expected!r}, found {current['state']!r}"
    )
