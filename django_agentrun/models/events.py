"""The append-only event log of a run."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from ..exceptions import AppendOnlyError
from ..fields import json_field
from .runs import Run


class RunEventQuerySet(models.QuerySet["RunEvent"]):
    def bulk_create(self, objs, *args: Any, **kwargs: Any):
        if kwargs.get("update_conflicts") or kwargs.get("ignore_conflicts"):
            raise AppendOnlyError("Run events are append-only: bulk_create cannot upsert or skip.")
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise AppendOnlyError("Run events are append-only: bulk_update() is refused.")

    def update_or_create(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError("Run events are append-only: update_or_create() is refused.")

    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Run events are append-only: QuerySet.update() is refused.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Run events are append-only: QuerySet.delete() is refused.")


class RunEvent(models.Model):
    """One entry of a run's append-only history; `seq` is gap-free per run."""

    # No index of its own: the unique (run, seq) leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    payload = json_field(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    objects = RunEventQuerySet.as_manager()

    class Meta:
        ordering = ["run", "seq"]
        base_manager_name = "objects"
        constraints = [
            # Also the fence of a lone write: a refused one inserts seq 1 again and fails on
            # this constraint by name (store.FENCE_CONSTRAINT; a test checks it is here).
            models.UniqueConstraint(fields=["run", "seq"], name="agentrun_runevent_seq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise AppendOnlyError(
                f"Run event #{self.seq} cannot be changed: events are append-only."
            )
        # Always an INSERT: a new instance carrying an existing pk fails instead of overwriting.
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any):
        raise AppendOnlyError(f"Run event #{self.seq} cannot be deleted: events are append-only.")
