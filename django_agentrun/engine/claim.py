"""The claim and what is decided at it, from the database, never from the message: take
the lease (from a dead holder too), count a recovery, honour a cancel or a deadline, give
up after too many recoveries, and start the next turn unless a guard stops the run first."""

from __future__ import annotations

import logging

from django.utils import timezone

from .. import store, transitions
from ..agents import get_agent
from ..conf import agentrun_settings
from ..events import payloads
from ..exceptions import LeaseLost, UnknownAgent
from ..failpoints import failpoint
from ..identity import holder_is_dead
from ..models import Run, ToolCall
from ..states import RunState, TurnState
from . import guards
from .step import Outcome, Step, StepEnded

logger = logging.getLogger(__name__)


def claim(step: Step) -> store.Lease | None:
    """Claim the run and decide what this step does, in one transaction; None: someone
    else holds it, or there is nothing to advance."""
    try:
        with step.tx(atomic=True):
            claimed = store.claim(step.run_id, step.owner, steal_from=step.steal_from)
            if claimed is None:
                claimed = _from_dead_holder(step)
            if claimed is None:
                return None
            step.lease, step.run, step.took_over = claimed.lease, claimed.run, claimed.took_over
            _load(step, claimed)
            _decide(step)
    except StepEnded as stop:  # committed: the run ended, parked or goes on elsewhere
        step.outcome = stop.outcome
        step.released = stop.outcome in (Outcome.FINISHED, Outcome.PARKED)
        step.stopped = True
    except LeaseLost:
        return None
    failpoint("claim.after_commit")
    return step.lease


def _from_dead_holder(step: Step) -> store.Claimed | None:
    """A holder on this machine that provably died (a killed pool child) is taken over at
    once, not after its lease expires (identity.holder_is_dead)."""
    holder = Run.objects.filter(pk=step.run_id).values_list("lease_owner", flat=True).first()
    if not holder or not holder_is_dead(holder):
        return None
    claimed = store.claim(step.run_id, step.owner, steal_from=holder)
    if claimed is not None:
        logger.info("Took over the lease of dead process %s run_id=%s", holder, step.run_id)
    return claimed


def _load(step: Step, claimed: store.Claimed) -> None:
    """The run's turns, each with its tool calls (`turn.calls`)."""
    step.turns = claimed.turns
    calls_by_turn: dict[int, list[ToolCall]] = {}
    for call in claimed.calls:
        calls_by_turn.setdefault(call.turn_index, []).append(call)
    for turn in step.turns:
        turn.calls = calls_by_turn.get(turn.index, [])  # type: ignore[attr-defined]


def _decide(step: Step) -> None:
    run, work = step.run, step.work()
    if step.took_over:
        # This claim took the lease from a holder that never released it: one event per
        # recovery (recovery_attempts counts them since the last completed turn).
        work.record(payloads.recovery(run.recovery_attempts, step.lease.epoch))
    if run.cancel_requested_at is not None:
        step.close(RunState.CANCELLED, run.cancel_reason or "cancelled")
    if step.deadline_passed():
        step.close(RunState.TIMED_OUT, "deadline passed")
    if run.state == RunState.QUEUED:
        old = transitions.move(run, RunState.RUNNING)
        work.record(payloads.run_started(run, step.owner))
        step.write(old_state=old, fields={"started_at": run.started_at or timezone.now()})
    if run.recovery_attempts > agentrun_settings.MAX_RECOVERY_ATTEMPTS:
        step.fail(
            "recovery_exhausted",
            f"The run was recovered {run.recovery_attempts} times after crashes; giving up "
            "(AGENTRUN_MAX_RECOVERY_ATTEMPTS).",
            "recovery",
        )
    try:
        step.agent = get_agent(run.agent)
    except UnknownAgent as exc:
        step.fail("unknown_agent", str(exc), "pre_turn")
    last = step.turns[-1] if step.turns else None
    if last is not None and last.state in (TurnState.RUNNING, TurnState.AWAITING_TOOL):
        # RUNNING: the model was asked but its answer never committed: ask again.
        step.turn = last
    elif not step.recover_only:
        _begin_turn(step)
    if work.recorded:
        step.write()


def _begin_turn(step: Step) -> None:
    """Guards before a new turn (the turn limit, the budget), then the turn."""
    run, config = step.run, step.config
    answered = sum(1 for t in step.turns if t.content is not None)
    max_turns = config.get("max_turns") or agentrun_settings.DEFAULT_MAX_TURNS
    if answered >= max_turns:
        step.complete("max_turns")
    budget = config.get("budget") or {}
    if budget:
        breach = guards.check_budget(
            budget,
            model=config["model"],
            totals=run.usage(),
            cost_usd=run.cost_usd,
            next_prompt_tokens=_estimate_next_prompt(step),
            max_tokens=config.get("max_tokens") or agentrun_settings.DEFAULT_MAX_TOKENS,
        )
        if breach is not None:
            step.work().record(
                payloads.budget_exceeded(breach.limit, breach.projected, breach.allowed)
            )
            step.fail("budget_exceeded", breach.message(), "pre_turn")
    index = step.turns[-1].index + 1 if step.turns else 0
    turn = transitions.start_turn(step.work(), run, index, final=answered == max_turns - 1)
    turn.calls = []  # type: ignore[attr-defined]
    step.turns.append(turn)
    step.turn = turn


def _estimate_next_prompt(step: Step) -> int:
    answered = [t for t in step.turns if t.content is not None]
    if not answered:
        return guards.estimate_tokens(
            [step.config.get("system", ""), step.config.get("tools", []), step.run.input]
        )
    last = answered[-1]
    # The results as the model will see them (media priced as the API bills it).
    added = sum(
        guards.estimate_tokens(c.tool_result_block()["content"])
        for c in last.calls  # type: ignore[attr-defined]
        if c.is_closed
    )
    prompt = last.input_tokens + last.cache_creation_input_tokens + last.cache_read_input_tokens
    return prompt + last.output_tokens + added
