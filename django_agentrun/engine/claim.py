"""The claim and what is decided at it, from the database, never from the message: take
the lease (from a dead holder too), count a recovery, honour a cancel or a deadline, give
up after too many recoveries; and before each new turn, the guards that may end the run
first (the turn limit, the budget)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from .. import children, store, transitions
from ..agents import capped_agents, get_agent, registered_agents
from ..conf import agentrun_settings
from ..events import payloads
from ..exceptions import UnknownAgent
from ..failpoints import failpoint
from ..identity import holder_is_dead
from ..models import Run, Turn
from ..states import TOOL_CALL_CLOSED, RunState
from . import guards
from .follows import At, Ended, commit_of
from .history import build_messages
from .step import Commit, Sent, Step

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capped:
    """What a claim over a cap returns: the cap (store/caps.py) it found full."""

    share: store.Share


def claim(step: Step) -> Commit | Capped | None:
    """Claim the run and decide at the claim, in one transaction; the commit of what was
    decided (a Commit whose write is sent already), Capped (the run waits for a slot under
    a cap), or None: someone else holds the run, or there is nothing to advance."""
    with transaction.atomic():
        capped = _over_cap(step)
        if capped is not None:
            return Capped(capped)
        claimed = store.claim(step.run_id, step.owner, steal_from=step.steal_from)
        if claimed is None:
            claimed = _from_dead_holder(step)
        if claimed is None:
            return None
        step.lease, step.run, step.took_over = claimed.lease, claimed.run, claimed.took_over
        step.claimed_expiry = claimed.run.lease_expires_at
        step.load(claimed.turns, claimed.calls)
        if step.run.conversation_position and not step.settle_only:
            step.load_earlier(store.earlier_history(step.run))
        commit = decide(step)
        if commit.write is not None and (commit.write.events or commit.write.run_fields):
            step.store.send(commit.write)
    commit.sent = Sent.WITH_CLAIM
    if step.failpoints:
        failpoint("claim.after_commit")
    return commit


def caps_set() -> bool:
    """Whether any cap is set (AGENTRUN_MAX_RUNS_PER_KEY, an Agent's max_concurrent_runs):
    without one, nothing about caps is read or counted."""
    return bool(agentrun_settings.MAX_RUNS_PER_KEY or capped_agents())


def caps_of(agent: str, share_key: str) -> list[store.Share]:
    """The caps a run of `agent` with `share_key` is worked under: its agent's
    max_concurrent_runs, AGENTRUN_MAX_RUNS_PER_KEY for its key (a run made before keys
    were kept has none)."""
    shares: list[store.Share] = []
    found = registered_agents().get(agent)
    if found is not None and found.max_concurrent_runs:
        shares.append(("agent", agent, found.max_concurrent_runs))
    per_key = agentrun_settings.MAX_RUNS_PER_KEY
    if per_key and share_key:
        shares.append(("share_key", share_key, per_key))
    return shares


def _over_cap(step: Step) -> store.Share | None:
    """The cap this claim would exceed, or None: nothing is counted unless some cap is set,
    and never for the reaper's recovery or a take-over (the run is worked already)."""
    if step.settle_only or step.steal_from:
        return None
    if not caps_set():
        return None
    found = store.claimable(step.run_id)
    if found is None:
        return None
    return store.over_cap(step.run_id, caps_of(found["agent"], found["share_key"]))


def _from_dead_holder(step: Step) -> store.Claimed | None:
    """A holder on this machine that provably died (a killed pool child) is taken over at
    once, not after its lease expires (identity.holder_is_dead), once nothing it started
    is left running (children.py): a recovered call never runs beside its first attempt."""
    holder = Run.objects.filter(pk=step.run_id).values_list("lease_owner", flat=True).first()
    if not holder or not holder_is_dead(holder):
        return None
    if not children.kill_marked(holder):
        logger.warning(
            "Processes of dead holder %s outlive it; waiting for its lease run_id=%s",
            holder,
            step.run_id,
        )
        return None
    claimed = store.claim(step.run_id, step.owner, steal_from=holder)
    if claimed is not None:
        logger.info("Took over the lease of dead process %s run_id=%s", holder, step.run_id)
    return claimed


def decide(step: Step) -> Commit:
    """What the claim decides; its write holds the run's start and the recovery, if any."""
    run, write = step.run, step.write()
    if step.took_over:
        transitions.record_recovery(write, run, step.lease.epoch)
    if run.cancel_requested_at is not None:
        reason = run.cancel_reason or "cancelled"
        return commit_of(step, write, At.CLAIM, Ended.CANCEL_REQUESTED, reason=reason)
    if step.deadline_passed():
        return commit_of(step, write, At.CLAIM, Ended.DEADLINE_PASSED, reason="deadline passed")
    if run.state == RunState.QUEUED:
        transitions.begin_run(write, run, step.owner)
    if run.recovery_attempts > agentrun_settings.MAX_RECOVERY_ATTEMPTS:
        message = (
            f"The run was recovered {run.recovery_attempts} times after crashes; giving up "
            "(AGENTRUN_MAX_RECOVERY_ATTEMPTS)."
        )
        failed = {"code": "recovery_exhausted", "message": message, "phase": "recovery"}
        return commit_of(step, write, At.CLAIM, Ended.RECOVERIES_EXHAUSTED, **failed)
    try:
        step.agent = get_agent(run.agent)
    except UnknownAgent as exc:
        failed = {"code": "unknown_agent", "message": str(exc), "phase": "pre_turn"}
        return commit_of(step, write, At.CLAIM, Ended.AGENT_UNKNOWN, **failed)
    return commit_of(step, write, At.CLAIM, Ended.CLAIMED)


def new_turn(step: Step) -> Commit | Turn:
    """The next turn (in memory: it is written with its answer), or the commit that ends the
    run first: the turn limit reached, or the budget that the turn would breach."""
    run, config = step.run, step.config
    if run.conversation_position and step.turns_done:
        # A person may have repaired an earlier run meanwhile (replace_tool_result): the
        # next request sends the history as it is now, not as this task first read it.
        if store.earlier_version(run) != step.earlier_version:
            step.load_earlier(store.earlier_history(run))
    answered = sum(1 for t in step.turns if t.content is not None)
    max_turns = config.max_turns
    if answered >= max_turns:
        return commit_of(step, step.write(), At.BEFORE_TURN, Ended.TURN_LIMIT)
    budget = config.budget
    if budget:
        breach = guards.check_budget(
            budget,
            model=config.model,
            totals=run.usage(),
            cost_usd=run.cost_usd,
            next_prompt_tokens=_estimate_next_prompt(step),
            max_tokens=config.max_tokens,
            # The last answer ran US-only (a workspace default, say): the next one will too.
            us_only=any(
                (t.usage_details or {}).get("inference_geo") == "us" for t in step.turns[-1:]
            ),
        )
        if breach is not None:
            write = step.write()
            write.record(payloads.budget_exceeded(breach.limit, breach.projected, breach.allowed))
            failed = {"code": "budget_exceeded", "message": breach.message(), "phase": "pre_turn"}
            return commit_of(step, write, At.BEFORE_TURN, Ended.BUDGET_BREACHED, **failed)
    index = step.turns[-1].index + 1 if step.turns else 0
    turn = Turn(run=run, index=index, is_final=answered == max_turns - 1)
    step.turn = turn
    return turn  # (At.BEFORE_TURN, Ended.ASK): the next commit is its answer


def _estimate_next_prompt(step: Step) -> int:
    answered = [t for t in step.turns if t.content is not None]
    if not answered:
        run = step.run
        # The whole history the first request sends: a conversation's earlier runs too.
        messages = build_messages(run.input, [], context=run.context, earlier=step.earlier)
        return guards.estimate_tokens([step.config.system, step.config.tools, messages])
    last = answered[-1]
    # The results as the model will see them (media priced as the API bills it).
    added = sum(
        guards.estimate_tokens(c.tool_result_block()["content"])
        for c in step.calls_of(last)
        if c.state in TOOL_CALL_CLOSED
    )
    prompt = last.input_tokens + last.cache_creation_input_tokens + last.cache_read_input_tokens
    return prompt + last.output_tokens + added
