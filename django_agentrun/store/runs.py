"""The run write: one fenced compare-and-set UPDATE of the run row that allocates its
events' seqs, with the events and the step's deferred row writes.

On Postgres they travel as one statement (`composed_write`); elsewhere the rows go first,
then the UPDATE, then the events. A write that is refused (the lease was taken over, the
run or a row changed) changes nothing, and says which refusal it was (`refused`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, NoReturn

from django.db import IntegrityError, connection
from django.utils import timezone

from ..exceptions import ConcurrentUpdate, LeaseLost
from ..models import Run, RunEvent
from .clock import DatabaseNow, db_value
from .rows import Deferred, RowInsert, RowUpdate, assignments, quoted
from .sql import sql

Event = tuple[str, dict[str, Any]]

# A lone write that is refused fails on this constraint (unique run + seq; the run's
# first event already has seq 1): see composed_write in queries.sql. A test checks the
# schema still has it.
FENCE_CONSTRAINT = "agentrun_runevent_seq"


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
class RunWrite:
    """A run write, built: `send(alone)` sends it (with `rows`, the step's deferred row
    writes) and returns whether a cancel is requested."""

    run: Run
    events: list[Event]
    lease: Lease | None = None
    old_state: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    incr: dict[str, Any] = field(default_factory=dict)
    rows: list[Deferred] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.now = timezone.now()
        self.fields = {**self.fields, "updated_at": self.now}
        if self.old_state is not None:
            self.fields["state"] = self.run.state
        self.composed = bool(self.events) and connection.vendor == "postgresql"

    def send(self, alone: bool = False) -> bool:
        """alone: the statement is its own transaction (autocommit), so it must refuse as a
        whole (composed_write's gates and the fence constraint)."""
        if self.composed:
            statement, values = self._composed(alone)
        else:
            for row in self.rows:
                row.send()
            statement, values = self._update()
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, values)
                row = cursor.fetchone()
        except IntegrityError as exc:
            if not (alone and _fenced_out(exc)):
                raise
            row = None
        if row is None:
            refused(self.run, self.lease, self.old_state)
        if self.composed:
            for item, value in zip(self.rows, row[2:], strict=True):
                if isinstance(item, RowInsert):
                    item.assign(value)
                else:
                    item.check(value)
        last_seq, cancel_requested = int(row[0]), row[1] is not None
        if self.events and not self.composed:
            self._insert_events(last_seq - len(self.events) + 1)
        self._apply_to_instance(last_seq)
        return cancel_requested

    # -- statements --------------------------------------------------------------------

    def _update(self, gates: str = "") -> tuple[str, list[Any]]:
        sets, params = assignments(Run, self.fields)
        for name, delta in self.incr.items():
            column = quoted(Run._meta.get_field(name).column)
            sets.append(f"{column} = {column} + %s")
            params.append(db_value(Run, name, delta))
        params.append(len(self.events))
        params.append(db_value(Run, "id", self.run.pk))
        conditions = ""
        if self.old_state is not None:
            conditions += sql("expected_state")
            params.append(self.old_state)
        if self.lease is not None:
            conditions += sql("fence")
            params += [self.lease.epoch, self.lease.owner]
        statement = sql("run_update", assignments=", ".join(sets), conditions=conditions + gates)
        return statement, params

    def _composed(self, alone: bool) -> tuple[str, list[Any]]:
        pk = quoted("id")
        ctes = "".join(
            f"c{i} AS ({u.sql} RETURNING {pk}), "
            if isinstance(u, RowInsert)
            else f"c{i} AS ({u.sql} RETURNING 1), "
            for i, u in enumerate(self.rows)
        )
        results = "".join(
            f", (SELECT array_agg({pk} ORDER BY {pk}) FROM c{i})"
            if isinstance(u, RowInsert)
            else f", (SELECT count(*) FROM c{i})"
            for i, u in enumerate(self.rows)
        )
        gates = ""
        if alone:
            gates = "".join(
                sql("gate", i=i) for i, u in enumerate(self.rows) if isinstance(u, RowUpdate)
            )
        update, params = self._update(gates)
        payload = RunEvent._meta.get_field("payload")
        statement = sql(
            "composed_write",
            ctes=ctes,
            run_update=update,
            seq=sql("seq_alone" if alone else "seq_in_transaction"),
            source="" if alone else "r, ",
            rows=", ".join(["(%s, %s, %s::jsonb)"] * len(self.events)),
            results=results,
        )
        values = [p for u in self.rows for p in u.params] + params
        values += [
            db_value(Run, "id", self.run.pk),
            len(self.events),
            db_value(RunEvent, "created_at", self.now),
        ]
        for i, (kind, data) in enumerate(self.events, start=1):
            values += [i, kind, payload.get_db_prep_save(data, connection)]
        return statement, values

    def _insert_events(self, first: int) -> None:
        payload = RunEvent._meta.get_field("payload")
        run_id = db_value(Run, "id", self.run.pk)
        created = db_value(RunEvent, "created_at", self.now)
        params: list[Any] = []
        for i, (kind, data) in enumerate(self.events):
            params += [run_id, first + i, kind, payload.get_db_prep_save(data, connection), created]
        statement = sql(
            "events_insert", rows=", ".join(["(%s, %s, %s, %s, %s)"] * len(self.events))
        )
        with connection.cursor() as cursor:
            cursor.execute(statement, params)

    def _apply_to_instance(self, last_seq: int) -> None:
        run = self.run
        run.last_seq = last_seq
        for name, value in self.fields.items():
            if name != "state":
                setattr(run, name, timezone.now() if isinstance(value, DatabaseNow) else value)
        for name, delta in self.incr.items():
            setattr(run, name, getattr(run, name) + delta)


def _fenced_out(exc: IntegrityError) -> bool:
    """The error of a lone write that refused (see FENCE_CONSTRAINT)."""
    diag = getattr(exc.__cause__, "diag", None)
    return diag is not None and diag.constraint_name == FENCE_CONSTRAINT


def refused(run: Run, lease: Lease | None, old_state: str | None) -> NoReturn:
    """Say which refusal a run write met: LeaseLost, or ConcurrentUpdate."""
    current = Run.objects.filter(pk=run.pk).values("state", "lease_epoch", "lease_owner").first()
    if current is None:
        raise ConcurrentUpdate(f"Run {run.pk} no longer exists")
    if lease is not None and (
        current["lease_epoch"] != lease.epoch or current["lease_owner"] != lease.owner
    ):
        raise LeaseLost(f"Run {run.pk}: lease epoch {lease.epoch} was superseded")
    if old_state is None or current["state"] == old_state:  # a lone write's row update missed
        raise ConcurrentUpdate(f"Run {run.pk}: one of its turns or tool calls changed concurrently")
    raise ConcurrentUpdate(
        f"Run {run.pk} changed concurrently: expected state {old_state!r}, found {current['state']!r}"
    )
