"""Each change of a run, turn or tool call: its state move (django-fsm, in memory, through
`_move`: no other module moves a state field), its row change and its event, added to a
write (store.Write) that the caller sends; side effects (wake-ups, signals) happen after it
commits. Shared by the engine, the services and the reaper; none of them changes a state
field any other way."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone
from django_fsm import TransitionNotAllowed

from . import signals, telemetry, wakeups
from .agents import share_key
from .content import StoredResult
from .events import EventType, payloads
from .exceptions import InvalidTransition
from .fields import storable_text
from .models import Run, RunEvent, ToolCall, Turn
from .outcomes import CallEnding, call_key
from .states import TOOL_CALL_CLOSED, ResultSource, RunState, ToolCallState, TurnState
from .store import Write, database_now, following_runs, hold_released, placed

TURN_CLOSED = (TurnState.COMPLETED, TurnState.CANCELLED, TurnState.FAILED)


def release(write: Write) -> None:
    """The lease given back, keeping the time: unclaimed since, a run lost its wake-up."""
    write.set_run(lease_owner="")
    write.lease_change = "now"


def wake(write: Write, run_id: Any) -> None:
    """A worker advances the run after the write commits."""
    write.then(lambda: wakeups.send(run_id))


def signal_after(write: Write, signal: Any, **kwargs: Any) -> None:
    """Send `signal` after the write commits (robustly: signals.send)."""
    write.then(lambda: signals.send(signal, sender=Run, **kwargs))


def _ended(write: Write, run: Run) -> None:
    """After the commit: run_finished, counted (telemetry), and the next queued run of its
    conversation woken."""
    state = run.state
    signal_after(write, signals.run_finished, run=run, state=state)
    write.then(lambda: telemetry.finished(run, state))
    if run.conversation_id is not None:
        write.then(lambda: [wakeups.send(pk) for pk in following_runs(run)])


def _move(obj: Any, target: str) -> str:
    """The one way a state field changes: apply the django-fsm transition to `target` in
    memory; the previous state. InvalidTransition (nothing changed) if the table has no
    such edge."""
    old = obj.state
    try:
        getattr(obj, f"to_{target}")()
    except TransitionNotAllowed as exc:
        raise InvalidTransition(
            f"{type(obj).__name__} {obj.pk}: cannot go from '{old}' to '{target}'"
        ) from exc
    return old


def _move_run(write: Write, run: Run, target: str) -> str:
    old = _move(run, target)
    write.expect_run(old)
    write.set_run(state=run.state)
    return old


# --------------------------------------------------------------------------- tool calls


def start_call(write: Write, call: ToolCall) -> None:
    """requested -> in_flight: its handler may start once this commits (write-ahead)."""
    old = _move(call, ToolCallState.IN_FLIGHT)
    now = timezone.now()
    write.change(
        call, old, state=call.state, attempt=call.attempt + 1, started_at=now, heartbeat_at=now
    )
    write.record(payloads.tool_call_started(call))


def close_call(
    write: Write,
    call: ToolCall,
    outcome: CallEnding,
    *,
    fields: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    kind: str = EventType.TOOL_CALL_FINISHED,
) -> None:
    """Close a call with its outcome."""
    result = outcome.result
    stored = result if isinstance(result, StoredResult) else StoredResult(result)
    old = _move(call, outcome.state)
    write.change(
        call,
        old,
        state=call.state,
        result=stored.value,
        result_format=stored.format,
        is_error=outcome.is_error,
        result_source=outcome.source,
        finished_at=timezone.now(),
        **(fields or {}),
    )
    write.record(payloads.call_result(call, kind=kind, extra=extra))


def close_calls(write: Write, endings: list[tuple[ToolCall, CallEnding]]) -> None:
    """Close a batch's calls with their outcomes, in one write."""
    for call, outcome in endings:
        close_call(write, call, outcome)


def approve_call(
    write: Write, call: ToolCall, decided: dict[str, Any], *, by: Any, note: str, edited: Any
) -> None:
    """awaiting_approval -> requested, approved (with a person's edits in `decided`)."""
    old = _move(call, ToolCallState.REQUESTED)
    write.change(call, old, state=call.state, approved=True, **decided)
    write.record(payloads.approval_granted(call, by, note, edited))


def retry_call(
    write: Write, call: ToolCall, decided: dict[str, Any], decision: dict[str, Any]
) -> None:
    """unknown -> requested: a person allows one new attempt (approved: it runs as is)."""
    old = _move(call, ToolCallState.REQUESTED)
    write.change(call, old, state=call.state, unknown_reason="", approved=True, **decided)
    write.record(payloads.tool_call_retried(call, decision))


def replace_result(
    write: Write, call: ToolCall, stored: StoredResult, *, is_error: bool, by: Any, note: str
) -> None:
    """A person replaces a closed call's result (repairing a stopped run's history); the
    call keeps its state."""
    write.change(
        call,
        call.state,
        result=stored.value,
        result_format=stored.format,
        is_error=is_error,
        result_source=ResultSource.PERSON,
    )
    extra = {"by": payloads.user_id(by), "note": note}
    write.record(payloads.call_result(call, kind=EventType.TOOL_RESULT_REPLACED, extra=extra))


def requeue_call(write: Write, call: ToolCall, policy: str) -> None:
    """in_flight -> requested: recovery allows a new attempt (`policy` says why)."""
    old = _move(call, ToolCallState.REQUESTED)
    write.change(call, old, state=call.state)
    write.record(payloads.tool_call_recovered(call, policy))


def requeue_calls(write: Write, calls: list[ToolCall], policy: str) -> None:
    """`requeue_call` for each of a batch's calls, in one write."""
    for call in calls:
        requeue_call(write, call, policy)


def mark_unknown(write: Write, call: ToolCall, reason: str) -> None:
    """in_flight -> unknown: a person settles it."""
    reason = storable_text(reason)
    old = _move(call, ToolCallState.UNKNOWN)
    write.change(call, old, state=call.state, unknown_reason=reason)
    write.record(payloads.tool_call_unknown(call, reason))


def ask_approval(
    write: Write, call: ToolCall, payload: dict[str, Any], deadline: datetime | None
) -> None:
    """requested -> awaiting_approval, with what a person needs to decide. The resume token
    is never stored: whoever shows the decision mints one (tokens.approval_token)."""
    old = _move(call, ToolCallState.AWAITING_APPROVAL)
    write.change(call, old, state=call.state, approval_payload=payload, approval_deadline=deadline)
    write.record(payloads.approval_requested(call, payload, deadline))


def cancel_text(call: ToolCall, text: str, *, started: bool = True) -> str:
    """The result a cancelled or timed-out call gives the model: what is known of whether
    it ran (an unknown outcome may have had its effect)."""
    if call.state == ToolCallState.UNKNOWN:
        return f"{text}. The tool may have run and had its effect; its outcome is unknown."
    if call.state == ToolCallState.IN_FLIGHT and started:
        return f"{text}. The tool may have started and had its effect; its outcome is unknown."
    return f"{text}. The tool was not run."


def cancel_calls(
    write: Write, calls: Iterable[ToolCall], text: str, not_started: frozenset[Any] = frozenset()
) -> None:
    """Close open calls with synthetic cancelled results (the transcript stays valid).
    `not_started`: the call_key of in_flight calls whose handler is known not to have run."""
    for call in calls:
        started = call_key(call) not in not_started
        outcome = CallEnding.synthetic(
            ToolCallState.CANCELLED, cancel_text(call, text, started=started)
        )
        close_call(write, call, outcome)


# --------------------------------------------------------------------------- turns


def answer_turn(
    write: Write,
    turn: Turn,
    answer: dict[str, Any],
    answered: Callable[..., payloads.Event],
    calls: list[ToolCall],
    *,
    run: Run | None = None,
    discarded: bool = False,
) -> None:
    """The model's answer: the turn with its content and usage (added now, with
    turn_started, unless an earlier claim wrote it), its tool calls, then awaiting_tool
    (some calls open; `run`, when given, waits for them too) or completed. `answered`
    builds the model_response event from what the answer leaves the turn and the run in
    (payloads.model_response's keywords). A `discarded` answer (unusable) leaves the turn
    open for the failure that follows."""
    if turn.pk is None:
        for name, value in answer.items():
            setattr(turn, name, value)
        write.add(turn)
        write.record(payloads.turn_started(turn))
    else:
        write.change(turn, turn.state, **answer)
    if discarded:
        write.record(answered(discarded=True))
        return
    write.add(*calls)
    if any(c.state not in TOOL_CALL_CLOSED for c in calls):
        old = _move(turn, TurnState.AWAITING_TOOL)
        write.change(turn, old, state=turn.state)
        if run is not None:
            await_tools(write, run)
        run_state = run.state if run is not None else None
        write.record(answered(turn_state=turn.state, run_state=run_state))
        return
    old = _move(turn, TurnState.COMPLETED)
    write.change(turn, old, state=turn.state, finished_at=timezone.now())
    write.record(answered(turn_state=turn.state))
    write.record(payloads.turn_completed(turn))


def complete_turn(write: Write, turn: Turn) -> None:
    """Every call of the turn is closed: completed."""
    old = _move(turn, TurnState.COMPLETED)
    write.change(turn, old, state=turn.state, finished_at=timezone.now())
    write.record(payloads.turn_completed(turn))


def abandon_turn(
    write: Write,
    turn: Turn | None,
    target: str,
    text: str,
    *,
    calls: Iterable[ToolCall] | None = None,
    not_started: frozenset[Any] = frozenset(),
) -> None:
    """Close an open turn as cancelled or failed, its open calls with synthetic results.
    `calls`: the turn's calls as the caller holds them; read from the database otherwise
    (a person may have closed some meanwhile)."""
    if turn is None or turn.state in TURN_CLOSED:
        return
    if turn.pk is None and not any(turn is added for added in write.added):
        # Asked, never answered: the turn is written now, as it ends.
        write.add(turn)
        write.record(payloads.turn_started(turn))
    if calls is not None:
        open_calls = [c for c in calls if c.state not in TOOL_CALL_CLOSED]
    else:
        open_calls = list(turn.tool_calls.open()) if turn.pk is not None else []
    cancel_calls(write, open_calls, text, not_started)
    old = _move(turn, target)
    write.change(turn, old, state=turn.state, finished_at=timezone.now())
    write.record(
        payloads.turn_cancelled(turn)
        if target == TurnState.CANCELLED
        else payloads.turn_failed(turn)
    )


def open_turn(run: Run) -> Turn | None:
    return run.turns.exclude(state__in=TURN_CLOSED).first()


# --------------------------------------------------------------------------- runs


def begin_run(write: Write, run: Run, worker: str) -> None:
    """queued -> running: a worker took the run up."""
    _move_run(write, run, RunState.RUNNING)
    write.set_run(started_at=run.started_at or timezone.now())
    write.record(payloads.run_started(run, worker))


def record_recovery(write: Write, run: Run, epoch: int) -> None:
    """The claim took the lease from a holder that never released it (one event per
    recovery; recovery_attempts counts them since the last completed turn)."""
    write.record(payloads.recovery(run.recovery_attempts, epoch))


def await_tools(write: Write, run: Run) -> None:
    """The answer asked for tools: the run waits for them (awaiting_tool)."""
    _move_run(write, run, RunState.AWAITING_TOOL)


def continue_run(write: Write, run: Run) -> None:
    """The turn is closed: the run goes on (running; its crash count starts over)."""
    if run.state != RunState.RUNNING:
        _move_run(write, run, RunState.RUNNING)
        write.record(payloads.run_continued(run))
    write.set_run(recovery_attempts=0)


def hand_off(write: Write, run: Run) -> None:
    """Give the lease back and wake a worker for what comes next (a fresh claim)."""
    release(write)
    wake(write, run.pk)


def hold(write: Write, run: Run, seconds: float, limited: dict[str, Any] | None = None) -> None:
    """Rate-limited before an answer (nothing paid): the lease given back and the run
    woken after `seconds` (a countdown), its released time pushed that far ahead so that
    the reaper does not take the wait for a lost wake-up. No sleep in the worker's slot.
    `limited`: the API's refusal (payloads.model_rate_limited's keywords), recorded."""
    if limited is not None:
        write.record(payloads.model_rate_limited(**limited))
    release(write)
    epoch = write.lease.epoch if write.lease is not None else None
    if epoch is not None:
        write.then(lambda: hold_released(run.pk, epoch, seconds))
    write.then(lambda: wakeups.send(run.pk, countdown=seconds))


def complete_run(write: Write, run: Run, stop_reason: str, output: Any, parsed: Any = None) -> None:
    _move_run(write, run, RunState.COMPLETED)
    totals = {k: getattr(run, k) + write.counters.get(k, 0) for k in run.usage()}
    write.record(payloads.run_completed(run, stop_reason, output, totals, parsed))
    release(write)
    write.set_run(output=output, stop_reason=stop_reason, finished_at=timezone.now())
    write.set_run(**({} if parsed is None else {"parsed_output": parsed}))
    _ended(write, run)


def fail_run(
    write: Write,
    run: Run,
    *,
    code: str,
    message: str,
    phase: str,
    turn: Turn | None = None,
    calls: Iterable[ToolCall] | None = None,
) -> None:
    """End the run as failed with a structured error; an open turn fails with it."""
    message = storable_text(message)
    abandon_turn(write, turn, TurnState.FAILED, f"Run failed ({code})", calls=calls)
    _move_run(write, run, RunState.FAILED)
    checkpoint = run.last_seq
    write.record(payloads.run_failed(run, code, message, phase, checkpoint))
    release(write)
    write.set_run(
        error_code=code,
        error_message=message,
        failure_phase=phase,
        last_checkpoint=checkpoint,
        finished_at=timezone.now(),
    )
    _ended(write, run)


def stop_run(
    write: Write,
    run: Run,
    target: str,
    reason: str,
    *,
    turn: Turn | None = None,
    calls: Iterable[ToolCall] | None = None,
    not_started: frozenset[Any] = frozenset(),
) -> None:
    """Cancel or time out a run: its open turn and calls close with synthetic results
    (completed outputs are kept). `turn` and `calls`: the open turn as the caller holds it
    (read from the database otherwise). `not_started`: in_flight calls whose handler is
    known not to have started."""
    cancelled = target == RunState.CANCELLED
    text = f"Cancelled: {reason}" if cancelled else f"Timed out: {reason}"
    if turn is None and calls is None:
        turn = open_turn(run)
    abandon_turn(write, turn, TurnState.CANCELLED, text, calls=calls, not_started=not_started)
    _move_run(write, run, target)
    write.record(payloads.run_closed(run, reason))
    release(write)
    write.set_run(stop_reason=target, finished_at=timezone.now())
    _ended(write, run)


def request_cancel(write: Write, run: Run, by: Any, reason: str) -> None:
    """Record a cancel request (its holder sees it within a second)."""
    write.set_run(
        cancel_requested_at=timezone.now(),
        cancel_reason=reason,
        cancel_requested_by=by if getattr(by, "pk", None) else None,
    )
    write.record(payloads.cancel_requested(by, reason))


def roll_back(write: Write, run: Run, by: Any, next_run: Any) -> None:
    """A later message of its conversation rolls `run` back: its turns leave the history."""
    write.set_run(rolled_back=True)
    write.record(payloads.run_rolled_back(by, next_run))


def park(write: Write, run: Run) -> None:
    """The run waits for a person: awaiting_approval, the lease given back."""
    _move_run(write, run, RunState.AWAITING_APPROVAL)
    write.record(payloads.run_parked(run))
    release(write)


def resume(write: Write, run: Run, by: Any, fields: dict[str, Any]) -> None:
    """failed, cancelled or timed_out -> queued: it continues from its history."""
    old = _move_run(write, run, RunState.QUEUED)
    write.record(payloads.run_resumed(run, by, old))
    release(write)
    write.set_run(**fields)
    wake(write, run.pk)


def after_decision(write: Write, run: Run, call: ToolCall) -> None:
    """After a person's decision: when no call of the turn waits for one any more, the run
    goes on (awaiting_tool, a worker is woken); otherwise only the decision is written."""
    waiting = call.turn.tool_calls.pending_decision().exclude(pk=call.pk).exists()
    if run.state == RunState.AWAITING_APPROVAL and not waiting:
        _move_run(write, run, RunState.AWAITING_TOOL)
        write.record(payloads.run_continued(run))
        release(write)
        wake(write, run.pk)


def resend_wakeup(write: Write, run: Run) -> None:
    """A run nobody picked up gets a new wake-up (the reaper), marking when."""
    if run.state == RunState.QUEUED:
        write.set_run(queued_at=database_now())
    else:
        write.lease_change = "now"
    write.record(payloads.reaper_requeued(run))
    wake(write, run.pk)


# --------------------------------------------------------------------------- new runs


def create_run(
    run: Run,
    *,
    forked_by: Any = None,
    turns: Iterable[Turn] = (),
    calls: Iterable[ToolCall] = (),
    history: Iterable[payloads.Event] = (),
) -> Run:
    """A new run (queued, the state it is built in): its row and its first event,
    run_created, saved at once in the caller's transaction (a Write changes a run that
    exists). A fork's also the turns and tool calls it copies and their events
    (`history`, after run_created); `forked_by`: who forked it. The caller wakes it on
    commit."""
    # The run's first span, in the trace of the caller; the run keeps its context.
    run.trace_context = telemetry.run_created(run)
    if not run.share_key:
        run.share_key = share_key(run)  # its share of the rate limit, and of a cap
    events = [payloads.run_created(run, run.owner, forked_by=forked_by), *history]
    run.last_seq = len(events)
    run.save(force_insert=True)
    turns, calls = list(turns), list(calls)
    for found in placed([*turns, *calls], events):  # held by their events, not copied
        setattr(found.obj, found.spec.seq_field, found.place + 1)
    Turn.objects.bulk_create(turns)
    ToolCall.objects.bulk_create(calls)
    RunEvent.objects.bulk_create(
        RunEvent(run=run, seq=seq, type=kind, payload=payload, created_at=run.created_at)
        for seq, (kind, payload) in enumerate(events, start=1)
    )
    return run
