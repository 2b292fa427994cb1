"""One advance of a run: claim it, then send the commits of its phases in turn, holding the
lease (a heartbeat renews it) and the history, until the run ends, parks, or is handed
back to the queue after AGENTRUN_TURNS_PER_TASK turns or AGENTRUN_TASK_SECONDS seconds.

Each phase returns a `Commit` (the write and what follows it, as step.FOLLOWS decides); the
driver sends it, fires its failpoint, and asks the next phase, or stops: the run finished,
parked or handed off, or (a commit with no write) the lease is lost, or must run out so
that the next claim counts a recovery. The driver sends every write but the claim's and an
atomic tool's result (`Sent`: each commits with more). Commits per turn with k tool calls:
k + 1 at most (the answer with the first call in flight, then each result with what
follows it; a batch of calls safe to run again goes in flight and closes in one commit
each: execution.py); a task's claim adds one.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from django.db import DatabaseError, connection, transaction

from .. import store, telemetry, transitions, wakeups
from ..abort import CANCEL_REQUESTED, AbortSignal
from ..clients import ModelClient
from ..conf import agentrun_settings
from ..content import StoredResult
from ..events import EventType, payloads
from ..exceptions import ConcurrentUpdate, LeaseLost
from ..failpoints import failpoint
from ..identity import worker_identity
from ..models import Run, ToolCall, Turn
from ..outcomes import CallEnding
from ..states import ResultSource, RunState, ToolCallState
from . import claim, execution, model_turn
from .follows import FOLLOWS, At, Ended, Facts, commit_of, interrupted
from .heartbeat import Heartbeat
from .step import Commit, Sent, Step, Then

logger = logging.getLogger(__name__)


class Outcome:
    """What `advance` returns."""

    NOT_CLAIMED = "not_claimed"
    CAPPED = "capped"  # over a cap of runs worked at once: it asks again later
    CONTINUED = "continued"  # handed back to the queue: a worker goes on with it
    PARKED = "parked"  # waits for a person
    FINISHED = "finished"  # completed, failed, cancelled or timed out
    LEASE_LOST = "lease_lost"  # another worker holds it now, or this one stopped in time


OUTCOMES = {
    Then.HAND_OFF: Outcome.CONTINUED,
    Then.PARK: Outcome.PARKED,
    Then.FINISH: Outcome.FINISHED,
    Then.LEAVE: Outcome.LEASE_LOST,
    Then.EXPIRE: Outcome.LEASE_LOST,
}

Answered = tuple[Turn, str, float]  # a model answer's turn, model and seconds (telemetry)

RETRY_PAUSE = 0.05  # seconds before a commit that was not written is sent again (doubling)


def advance(
    run_id: Any,
    *,
    owner: str | None = None,
    abort: AbortSignal | None = None,
    client: ModelClient | None = None,
    heartbeat: bool = False,
) -> str:
    """Advance the run as far as one task may (see the module's docstring); an Outcome.
    Safe to call twice at once: one claims it, the other leaves it alone."""
    step = Step(run_id, owner or worker_identity(), abort or AbortSignal(), client)
    return drive(step, heartbeat=heartbeat)


def settle_in_flight(run_id: Any, *, steal_from: str | None = None) -> str:
    """The reaper's half of recovery: claim an expired lease, apply the side-effect policy
    to in_flight calls (re-run allowed, reconciled, or unknown), wake a worker."""
    owner = f"reaper:{worker_identity()}"
    step = Step(run_id, owner, AbortSignal(), None, settle_only=True, steal_from=steal_from)
    # With a heartbeat: a reconcile check sees a cancel, and stops before the lease expires.
    return drive(step, heartbeat=True)


def drive(step: Step, *, heartbeat: bool = False) -> str:
    """Claim, send the step's commits under the lease (with a heartbeat if asked), in the
    span of this stretch of work on the run (telemetry.py)."""
    before = time.time()
    commit = claim.claim(step)
    if commit is None:
        return Outcome.NOT_CLAIMED
    if isinstance(commit, claim.Capped):
        column, value, cap = commit.share
        delay = agentrun_settings.CAPPED_RETRY_SECONDS * (1 + random.random() / 2)
        logger.info(
            "The cap of %s %s (%s) is reached: waits %.1fs run_id=%s",
            "agent" if column == "agent" else "key",
            value,
            cap,
            delay,
            step.run_id,
        )
        wakeups.send(step.run_id, countdown=delay)
        return Outcome.CAPPED
    run = step.run
    model = str((run.config or {}).get("model") or "")
    with telemetry.invoke_agent(run, model, recovery=step.settle_only) as stretch:
        started = run.started_at
        first = started is not None and started.timestamp() >= before - 0.001
        telemetry.claimed(stretch, run, first=first, recovery=step.took_over)
        outcome = _drive(step, commit, heartbeat)
        telemetry.stretch_ended(stretch, outcome, step.turns)
    if outcome in (Outcome.PARKED, Outcome.FINISHED) and not step.settle_only:
        _wake_next(run)
    return outcome


def _wake_next(run: Run) -> None:
    """A run under a cap gave its slot back (it waits for a person, or ended): wake the run
    queued longest under each of its caps, rather than leave it to ask again later."""
    if not claim.caps_set():
        return
    try:
        for column, value, _cap in claim.caps_of(run.agent, run.share_key):
            waiting = store.next_waiting(run.pk, column, value)
            if waiting is not None:
                wakeups.send(waiting)
    except DatabaseError:  # what this run did is committed; the waiting run asks again
        logger.warning("Could not wake the next run under a cap run_id=%s", run.pk, exc_info=True)


def _drive(step: Step, commit: Commit, heartbeat: bool) -> str:
    lease = step.lease
    assert lease is not None
    beat = Heartbeat(lease, step.abort) if heartbeat else None
    if beat is not None:
        beat.start()
    try:
        commit = _send_all(step, commit)
        if commit.then in (Then.LEAVE, Then.EXPIRE):
            logger.warning("%s run_id=%s epoch=%s", commit.reason, step.run_id, lease.epoch)
            if commit.then is Then.EXPIRE and (
                beat.give_up() if beat is not None else store.expire_lease(lease)
            ):
                # Ours still: it runs out now, so the next claim takes it over and counts
                # the recovery (a loop of such stops ends at AGENTRUN_MAX_RECOVERY_ATTEMPTS).
                wakeups.send(step.run_id)
        if commit.then is Then.PARK and commit.write.cancel_requested:
            cancel_parked(step.run)
            return Outcome.FINISHED
        return OUTCOMES[commit.then]
    except LeaseLost:
        logger.warning("Lease lost run_id=%s epoch=%s", step.run_id, lease.epoch)
        return Outcome.LEASE_LOST
    except Exception:
        # Treat it like a crash: the lease lapses, the reaper recovers the run and counts
        # the recovery, so a poison step ends as recovery_exhausted instead of looping.
        logger.exception("Advancing failed run_id=%s epoch=%s", step.run_id, lease.epoch)
        raise
    finally:
        if beat is not None:
            beat.stop()


def _send_all(step: Step, commit: Commit) -> Commit:
    """Send each commit and ask for the next while the run goes on here; the last one
    (what follows it is not `GO_ON`)."""
    answered: Answered | None = None
    read_again = 0  # refusals in a row that the lease survived (each closes a call: few)
    while True:
        if commit.write is None:
            return commit  # stop, writing nothing
        if commit.sent is Sent.BY_DRIVER:
            try:
                try:
                    step.store.send(commit.write)
                except DatabaseError as exc:
                    _send_again(step, commit.write, exc)
            except (LeaseLost, ConcurrentUpdate) as refusal:
                # Refused: the run changed meanwhile. A tool that ran keeps its result; a
                # step that still holds the lease goes on from what the database says.
                kept = keep_result(step, commit.write)
                read_again += 1
                if isinstance(refusal, ConcurrentUpdate) and read_again <= 3 and _read_again(step):
                    commit, answered = _next(step)
                    continue
                if kept:
                    reason = f"Run {step.run_id} changed meanwhile; result kept"
                    return Commit.stop(FOLLOWS[At.REFUSED, Ended.RESULT_KEPT].then, reason)
                raise
            read_again = 0
        if answered is not None:
            telemetry.answered(step.run, *answered, cost=commit.write.counters.get("cost_usd"))
        if commit.failpoint is not None and step.failpoints:
            failpoint(*commit.failpoint)
        if commit.then is not Then.GO_ON:
            return commit
        if commit.write.cancel_requested and not step.abort.cancel_requested:
            step.abort.abort(CANCEL_REQUESTED)
        commit, answered = _next(step)


def _read_again(step: Step) -> bool:
    """A commit was refused though this step still holds the lease: one of its calls was
    closed meanwhile by a late result (keep_result, of the worker that held the run before).
    Read the run as it is now and go on from there; False when the lease is not ours."""
    claimed = store.reread(step.lease)
    if claimed is None:
        return False
    logger.warning(
        "A call of the run was closed meanwhile (a late result): read again run_id=%s",
        step.run_id,
    )
    # What this step put in flight and did not run went with the refused write.
    step.run = claimed.run
    step.load(claimed.turns, claimed.calls)
    step.started.clear()
    step.not_started.clear()
    return True


def _send_again(step: Step, write: store.Write, error: DatabaseError) -> None:
    """A commit was not written. A deadlock or serialization failure rolled it back whole
    (it is one statement): send it again. A broken connection too, on a new one (had it
    landed, the new attempt is refused and recovery reads the database). So a tool's
    result, once its handler returned, is never lost to a rolled-back write: attempts go
    on, with a growing pause, while the lease holds (the heartbeat renews it and says when
    it is lost); any other error is raised."""
    pause, started = RETRY_PAUSE, time.monotonic()
    while True:
        lost = store.lost_race(error)
        if not (lost or store.connection_lost(error)) or connection.in_atomic_block:
            raise error
        held = not (step.abort.aborted and not step.abort.cancel_requested)
        if not held or time.monotonic() - started > agentrun_settings.LEASE_SECONDS:
            raise error
        logger.warning(
            "Commit not written (%s), sending it again run_id=%s",
            store.sqlstate(error) if lost else "connection lost",
            step.run_id,
        )
        if not lost:
            connection.close()  # a new connection for the next attempt
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
        try:
            step.store.send(write)
            return
        except DatabaseError as exc:
            error = exc


def _next(step: Step) -> tuple[Commit, Answered | None]:
    """The next phase's commit, and the model's answer it records (if it does)."""
    if step.abort.aborted or step.deadline_passed():
        facts = Facts()  # the interruption, met between two commits
        ended = interrupted(step, facts)
        write = step.write()
        known = {"reason": facts.reason, "reread": facts.reread}
        return commit_of(step, write, At.INTERRUPTED, ended, **known), None
    if step.settle_only:
        commit = execution.settle_only(step, step.turn)
        if commit is None:
            return commit_of(step, step.write(), At.SETTLED, Ended.NOTHING_LEFT), None
        return commit, None
    turn = step.turn
    if turn is None:
        if step.turns_done:
            # The turn is closed and committed; the next one not yet begun (nor enqueued).
            if step.failpoints:
                failpoint("turn.before_enqueue")
        made = claim.new_turn(step)
        if isinstance(made, Commit):
            return made, None
        turn = made
    if turn.content is None:
        telemetry.at_turn(turn.index)
        began = time.monotonic()
        commit = model_turn.ask(step, turn)
        # Recorded once the commit is sent (off the model turn's path: explanation/trace.md).
        return commit, (turn, step.config.model, time.monotonic() - began)
    return execution.next_commit(step, turn), None


def cancel_parked(run: Run) -> None:
    """A cancel request arrived as the run parked: nobody holds it now, so it applies at
    once instead of waiting for a person."""
    with transaction.atomic():
        run = store.lock_run(run.pk)
        if run.state != RunState.AWAITING_APPROVAL:
            return
        write = store.Write(run)
        transitions.stop_run(write, run, RunState.CANCELLED, run.cancel_reason or "cancelled")
        store.send(write)


LATE = "the tool returned after its run was stopped or recovered: its result is kept"


def keep_result(step: Step, write: store.Write) -> bool:
    """A commit holding tool results that ran (one call's, or a batch's) was refused (a
    cancel stopped the run, or recovery took the lease meanwhile). The tools ran, so each
    result is recorded anyway on its call as it is now, whoever holds the run: closing it
    if it is still open (in_flight in the attempt that ran, or unknown after recovery: the
    run then goes on as after a person's decision), or in place of the synthetic result a
    cancel gave it. A holder that was settling the call (the reaper's reconcile check, a
    take-over) finds its own write refused and reads the run again (_read_again). False
    when the commit held no executed result, or none could be recorded (a new attempt of
    the call runs: its holder records that one)."""
    changes = [
        c
        for c in write.changed
        if isinstance(c.obj, ToolCall) and c.fields.get("result_source") == ResultSource.EXECUTED
    ]
    if not changes:
        return False
    kept_any = False
    with transaction.atomic():  # one write per call, in order: each sees those before it
        for change in changes:
            call, run = store.lock_call(change.obj.pk)  # the run's row, then the call's
            kept = store.Write(run)
            if _keep(kept, change, call, run):
                store.send(kept)
                kept_any = True
                logger.warning("%s run_id=%s tool_call_id=%s", LATE, run.pk, call.tool_call_id)
    return kept_any


def _keep(kept: store.Write, change: Any, call: ToolCall, run: Run) -> bool:
    """Record one executed result in `kept` (keep_result): whether it is kept."""
    fields = change.fields
    result = StoredResult(fields["result"], fields["result_format"])
    if call.state == ToolCallState.IN_FLIGHT and call.attempt != change.obj.attempt:
        return False  # run again since (its class allows it): that attempt's result counts
    if call.state in (ToolCallState.IN_FLIGHT, ToolCallState.UNKNOWN):
        outcome = CallEnding(change.obj.state, result, fields["is_error"], ResultSource.EXECUTED)
        transitions.close_call(kept, call, outcome, extra={"late": True})
        transitions.after_decision(kept, run, call)
    elif call.state == ToolCallState.CANCELLED and call.result_source == ResultSource.SYNTHETIC:
        kept.change(
            call,
            call.state,
            result=result.value,
            result_format=result.format,
            is_error=fields["is_error"],
            result_source=ResultSource.EXECUTED,
        )
        extra = {"by": None, "note": LATE}
        kept.record(payloads.call_result(call, kind=EventType.TOOL_RESULT_REPLACED, extra=extra))
    else:
        return False
    return True
