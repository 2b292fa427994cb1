"""The append-only event log of a run.

Stored one row per commit (`RunEventRow`): the commit's events as one JSON array, with the
seq range they take (`seq` to `seq_to`, gap-free across a run's rows). Read one event per
seq (`RunEvent`): a view over those rows (the migration 0013_eventrows_commit_rows makes it,
on Postgres with jsonb_array_elements, on SQLite with json_each), so every reader (the API,
the streams, the admin, the projection) sees what it saw when each event had its row.

A `RunEvent`'s id is its row's id times ID_SPAN plus its place in the row; a `RunEvent`
saved or bulk-created adds rows (consecutive seqs of one run share one).
"""

from __future__ import annotations

from typing import Any

from django.db import models, router
from django.utils import timezone

from ..exceptions import AppendOnlyError
from ..fields import json_field
from .runs import Run

# A view row's id: its commit row's id * ID_SPAN + its place in the row (no commit holds
# a million events).
ID_SPAN = 1_000_000


class _AppendOnlyQuerySet(models.QuerySet):
    _what = "Run events"

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise AppendOnlyError(f"{self._what} are append-only: bulk_update() is refused.")

    def update_or_create(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError(f"{self._what} are append-only: update_or_create() is refused.")

    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError(f"{self._what} are append-only: QuerySet.update() is refused.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"{self._what} are append-only: QuerySet.delete() is refused.")

    def _refuse_upsert(self, kwargs: dict[str, Any]) -> None:
        if kwargs.get("update_conflicts") or kwargs.get("ignore_conflicts"):
            raise AppendOnlyError(
                f"{self._what} are append-only: bulk_create cannot upsert or skip."
            )


class RunEventRowQuerySet(_AppendOnlyQuerySet):
    def bulk_create(self, objs, *args: Any, **kwargs: Any):
        self._refuse_upsert(kwargs)
        return super().bulk_create(objs, *args, **kwargs)


class RunEventRow(models.Model):
    """One commit's events: `events` is a JSON array of [type, payload] pairs, seqs `seq`
    (the first) to `seq_to`."""

    # No index of its own: the unique (run, seq) leads with it.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="event_rows", db_index=False
    )
    seq = models.PositiveIntegerField()
    seq_to = models.PositiveIntegerField()
    events = json_field(default=list)
    created_at = models.DateTimeField(default=timezone.now)

    objects = RunEventRowQuerySet.as_manager()

    class Meta:
        ordering = ["run", "seq"]
        base_manager_name = "objects"
        constraints = [
            # Also the fence of a lone write: a refused one inserts seq 1 again and fails on
            # this constraint by name (store.FENCE_CONSTRAINT; a test checks it is here).
            models.UniqueConstraint(fields=["run", "seq"], name="agentrun_runevent_seq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq}-{self.seq_to}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise AppendOnlyError(f"Run events #{self.seq}-{self.seq_to} cannot be changed.")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError(f"Run events #{self.seq}-{self.seq_to} cannot be deleted.")


class RunEventQuerySet(_AppendOnlyQuerySet):
    def bulk_create(self, objs, *args: Any, **kwargs: Any):
        """Rows of consecutive seqs of one run go into one RunEventRow."""
        self._refuse_upsert(kwargs)
        objs = list(objs)
        groups: list[list[RunEvent]] = []
        for event in objs:
            last = groups[-1][-1] if groups else None
            if last is not None and last.run_id == event.run_id and last.seq + 1 == event.seq:
                groups[-1].append(event)
            else:
                groups.append([event])
        rows = [_row(group) for group in groups]
        RunEventRow.objects.using(self.db).bulk_create(rows)
        for group, row in zip(groups, rows, strict=True):
            for i, event in enumerate(group):
                if row.pk is not None:
                    event.pk = row.pk * ID_SPAN + i
                event._state.adding = False
                event._state.db = self.db
        return objs


def _row(events: list[RunEvent]) -> RunEventRow:
    first = events[0]
    return RunEventRow(
        run_id=first.run_id,
        seq=first.seq,
        seq_to=events[-1].seq,
        events=[[e.type, e.payload] for e in events],
        created_at=first.created_at,
    )


class RunEvent(models.Model):
    """One entry of a run's append-only history; `seq` is gap-free per run. A read-only
    view of the RunEventRow rows (one per commit; see the module's docstring)."""

    run = models.ForeignKey(
        Run, on_delete=models.DO_NOTHING, related_name="events", db_constraint=False
    )
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    payload = json_field(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    objects = RunEventQuerySet.as_manager()

    class Meta:
        managed = False
        db_table = "agentrun_event"
        ordering = ["run", "seq"]
        base_manager_name = "objects"

    def __str__(self) -> str:
        return f"#{self.seq} {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """A new event is a row of its own (store.send writes a commit's events together)."""
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise AppendOnlyError(
                f"Run event #{self.seq} cannot be changed: events are append-only."
            )
        using = kwargs.get("using") or router.db_for_write(RunEvent, instance=self)
        row = _row([self])
        row.save(using=using)
        self.pk = row.pk * ID_SPAN
        self._state.adding = False
        self._state.db = using

    def delete(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError(f"Run event #{self.seq} cannot be deleted: events are append-only.")
