"""Caps on the runs worked at once (AGENTRUN_MAX_RUNS_PER_KEY per fair-share key, an Agent's
max_concurrent_runs): counted among the live leases when a run is claimed, in the claim's
transaction (the store locks each cap first where it can), and the run that waits longest
queued under a cap, woken when a run under it gives its slot back."""

from __future__ import annotations

from typing import Any

from ..models import Run
from ..states import RUN_CLAIMABLE, RunPhase
from .backend import chosen
from .writes import Share


def over_cap(run_id: Any, shares: list[Share]) -> Share | None:
    """The first of `shares` whose cap the runs worked now (other than `run_id`) reach, or
    None. Inside the claim's transaction: the caps' locks are held until it ends."""
    return chosen().over_cap(run_id, shares) if shares else None


def claimable(run_id: Any) -> dict[str, Any] | None:
    """What a cap needs of a run about to be claimed (its agent and share key), or None when
    the claim would not take it anyway: a live holder, or a state no claim takes."""
    return (
        Run._base_manager.filter(pk=run_id, state__in=RUN_CLAIMABLE, lease_owner="")
        .values("agent", "share_key")
        .first()
    )


def next_waiting(run_id: Any, column: str, value: str) -> Any | None:
    """The queued run under the same cap that has waited longest, other than `run_id`; its
    pk, or None. Through agentrun_run_ph_queued_idx (queued runs in queue order); a run
    released between tasks is not looked for: its own wake-up is under way."""
    return (
        Run._base_manager.filter(phase=RunPhase.QUEUED, **{column: value})
        .exclude(pk=run_id)
        .order_by("queued_at")
        .values_list("pk", flat=True)
        .first()
    )
