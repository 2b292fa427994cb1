"""One advance of a run, from claim to release: claim (and decide) in one transaction, then
the model turn or the open tool calls, each durable step its own commit, under a lease
that a heartbeat renews; at most one turn per advance, the next one woken on commit.

Commits per turn with k tool calls: claim+turn_started, the answer (the intent), the first
call's in_flight, then each result (sharing its commit with the next call's in_flight):
k + 3, or 2 with none.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import store, wakeups
from ..abort import AbortSignal
from ..clients import ModelClient
from ..exceptions import LeaseLost
from ..identity import worker_identity
from ..states import TurnState
from .claim import claim
from .execution import recover_only, tools_step
from .heartbeat import Heartbeat
from .model_turn import model_step
from .step import Outcome, Step, StepEnded

logger = logging.getLogger(__name__)


def advance(
    run_id: Any,
    *,
    owner: str | None = None,
    abort: AbortSignal | None = None,
    client: ModelClient | None = None,
    heartbeat: bool = False,
) -> str:
    """Advance the run by at most one turn. Safe to call twice at once: one claims it."""
    step = Step(run_id, owner or worker_identity(), abort or AbortSignal(), client)
    return drive(step, heartbeat=heartbeat)


def recover_in_flight(run_id: Any, *, steal_from: str | None = None) -> str:
    """The reaper's half of recovery: claim an expired lease, apply the side-effect
    policy to in_flight calls (re-run allowed, reconcile, or unknown), wake a worker."""
    owner = f"reaper:{worker_identity()}"
    step = Step(run_id, owner, AbortSignal(), None, recover_only=True, steal_from=steal_from)
    # With a heartbeat: a reconcile check sees a cancel, and stops before the lease expires.
    return drive(step, heartbeat=True)


def drive(step: Step, *, heartbeat: bool = False) -> str:
    """Claim, run the step under the lease (with a heartbeat if asked), release."""
    lease = claim(step)
    if lease is None:
        return Outcome.NOT_CLAIMED
    beat = None
    if heartbeat:
        beat = Heartbeat(lease, step.abort)
        beat.start()
    try:
        return _run(step)
    except LeaseLost:
        logger.warning("Lease lost run_id=%s epoch=%s", step.run_id, lease.epoch)
        return Outcome.LEASE_LOST
    except Exception:
        # Treat it like a crash: the lease lapses, the reaper recovers the run and counts
        # the recovery, so a poison step ends as recovery_exhausted instead of looping.
        logger.exception("Advancing failed run_id=%s epoch=%s", step.run_id, lease.epoch)
        step.released = True
        raise
    finally:
        if beat is not None:
            beat.stop()
        if not step.released and store.release_lease(lease):
            # Still ours (the step stopped without finishing, e.g. its heartbeat could not
            # renew for a while): the run must not wait for the stale sweep.
            wakeups.send(step.run_id)


def _run(step: Step) -> str:
    if step.stopped:
        return step.outcome
    try:
        turn = step.turn
        if step.recover_only:
            recover_only(step, turn)
        assert turn is not None
        if turn.state == TurnState.RUNNING:
            model_step(step, turn)
        if turn.state == TurnState.AWAITING_TOOL:
            tools_step(step, turn)
    except StepEnded as stop:
        return stop.outcome
    return step.outcome
