"""A run held back: its lease given back with a time ahead of now (a rate limit's wait),
so that the reaper counts its wake-up lost only once that time has passed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from ..models import Run


def hold_released(run_id: Any, epoch: int, seconds: float) -> bool:
    """Push a released lease's time `seconds` ahead (the database's clock), unless the run
    was claimed since (its epoch moved on). Sent after the release commits: if it is
    lost, the reaper merely re-sends the wake-up early (the governor says "not now")."""
    later = ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )
    rows = Run.objects.filter(pk=run_id, lease_owner="", lease_epoch=epoch)
    return rows.update(lease_expires_at=later) == 1
