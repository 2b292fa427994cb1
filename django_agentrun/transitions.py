"""Each change of a run, turn or tool call: its state move (django-fsm, in memory), its row
change and its event, written into a unit of work (store.unit). Shared by the engine, the
services and the reaper; none of them changes a state field any other way.

A run-level transition is the unit's run write, fenced by the lease when one is given;
call- and turn-level ones ride on the next run write. Side effects (wake-ups, signals)
are registered with the unit and happen after it commits.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone
from django_fsm import TransitionNotAllowed

from . import signals, wakeups
from .content import StoredResult
from .events import EventType, payloads
from .exceptions import InvalidTransition
from .fields import storable_text
from .models import Run, ToolCall, Turn
from .states import ResultSource, RunState, ToolCallState, TurnState
from .store import DatabaseNow, Lease, Unit

TURN_CLOSED = (TurnState.COMPLETED, TurnState.CANCELLED, TurnState.FAILED)


def move(obj: Any, target: str) -> str:
    """Apply the django-fsm transition to `target` in memory; the previous state.
    InvalidTransition (nothing changed) if the table has no such edge."""
    old = obj.state
    try:
        getattr(obj, f"to_{target}")()
    except TransitionNotAllowed as exc:
        raise InvalidTransition(
            f"{type(obj).__name__} {obj.pk}: cannot go from '{old}' to '{target}'"
        ) from exc
    return old


def released() -> dict[str, Any]:
    """The lease given back; it keeps the time (the database's): a run nobody claims since
    then lost its wake-up (the reaper)."""
    return {"lease_owner": "", "lease_expires_at": DatabaseNow()}


def wake(unit: Unit, run_id: Any) -> None:
    """A worker advances the run after the unit commits."""
    unit.on_commit(lambda: wakeups.send(run_id))


def signal_after(unit: Unit, signal: Any, **kwargs: Any) -> None:
    unit.on_commit(lambda: signal.send(sender=Run, **kwargs))


# --------------------------------------------------------------------------- tool calls


def start_call(unit: Unit, call: ToolCall) -> None:
    """requested -> in_flight: its handler may start once this commits (write-ahead)."""
    old = move(call, ToolCallState.IN_FLIGHT)
    now = timezone.now()
    unit.update(call, old, attempt=call.attempt + 1, started_at=now, heartbeat_at=now)
    unit.record(payloads.tool_call_started(call))


def close_call(
    unit: Unit,
    call: ToolCall,
    target: str,
    result: Any,
    *,
    is_error: bool,
    source: str,
    fields: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    kind: str = EventType.TOOL_CALL_FINISHED,
) -> None:
    """Close a call with its result: a StoredResult (content.stored_result), or a JSON value
    (e.g. the text of a synthetic result)."""
    stored = result if isinstance(result, StoredResult) else StoredResult(result)
    old = move(call, target)
    unit.update(
        call,
        old,
        result=stored.value,
        result_format=stored.format,
        is_error=is_error,
        result_source=source,
        finished_at=timezone.now(),
        **(fields or {}),
    )
    unit.record(payloads.call_result(call, kind=kind, extra=extra))


def retry_call(
    unit: Unit, call: ToolCall, decided: dict[str, Any], decision: dict[str, Any]
) -> None:
    """unknown -> requested: a person allows one new attempt (approved: it runs as is)."""
    old = move(call, ToolCallState.REQUESTED)
    unit.update(call, old, unknown_reason="", approved=True, **decided)
    unit.record(payloads.tool_call_retried(call, decision))


def replace_result(
    unit: Unit, call: ToolCall, stored: StoredResult, *, is_error: bool, by: Any, note: str
) -> None:
    """A person replaces a closed call's result (repairing a stopped run's history); the
    call keeps its state."""
    unit.update(
        call,
        None,
        result=stored.value,
        result_format=stored.format,
        is_error=is_error,
        result_source=ResultSource.PERSON,
    )
    extra = {"by": payloads.user_id(by), "note": note}
    unit.record(payloads.call_result(call, kind=EventType.TOOL_RESULT_REPLACED, extra=extra))


def requeue_call(unit: Unit, call: ToolCall, policy: str) -> None:
    """in_flight -> requested: recovery allows a new attempt (`policy` says why)."""
    old = move(call, ToolCallState.REQUESTED)
    unit.update(call, old)
    unit.record(payloads.tool_call_recovered(call, policy))


def mark_unknown(unit: Unit, call: ToolCall, reason: str) -> None:
    """in_flight -> unknown: a person settles it."""
    reason = storable_text(reason)
    old = move(call, ToolCallState.UNKNOWN)
    unit.update(call, old, unknown_reason=reason)
    unit.record(payloads.tool_call_unknown(call, reason))


def ask_approval(
    unit: Unit, call: ToolCall, payload: dict[str, Any], token: str, deadline: datetime | None
) -> None:
    """requested -> awaiting_approval, with its payload and resume token."""
    old = move(call, ToolCallState.AWAITING_APPROVAL)
    unit.update(call, old, approval_payload=payload, approval_deadline=deadline)
    unit.record(payloads.approval_requested(call, payload, token, deadline))


def cancel_text(call: ToolCall, text: str, *, started: bool = True) -> str:
    if call.state == ToolCallState.IN_FLIGHT and started:
        return f"{text}. The tool may have started; its outcome is unknown."
    return f"{text}. The tool was not run."


def cancel_calls(
    unit: Unit, calls: Iterable[ToolCall], text: str, not_started: frozenset[Any] = frozenset()
) -> None:
    """Close open calls with synthetic cancelled results (the transcript stays valid)."""
    for call in calls:
        close_call(
            unit,
            call,
            ToolCallState.CANCELLED,
            cancel_text(call, text, started=call.pk not in not_started),
            is_error=True,
            source=ResultSource.SYNTHETIC,
        )


# --------------------------------------------------------------------------- turns


def start_turn(unit: Unit, run: Run, index: int, *, final: bool) -> Turn:
    """A new turn (the model is asked next); inserted with the next run write."""
    turn = Turn(run=run, index=index, is_final=final)
    unit.insert([turn])
    unit.record(payloads.turn_started(turn))
    return turn


def close_turn(unit: Unit, turn: Turn) -> None:
    """Every call of the turn is closed (or it had none): completed."""
    old = move(turn, TurnState.COMPLETED)
    unit.update(turn, old, finished_at=timezone.now())
    unit.record(payloads.turn_completed(turn))


def end_turn(unit: Unit, turn: Turn | None, target: str, text: str, **kw: Any) -> None:
    """Close an open turn as cancelled or failed, its open calls with synthetic results
    (read from the database: a person may have closed some meanwhile)."""
    if turn is None or turn.state in TURN_CLOSED:
        return
    cancel_calls(unit, turn.tool_calls.open(), text, **kw)
    old = move(turn, target)
    unit.update(turn, old, finished_at=timezone.now())
    unit.record(
        payloads.turn_cancelled(turn)
        if target == TurnState.CANCELLED
        else payloads.turn_failed(turn)
    )


def open_turn(run: Run) -> Turn | None:
    return run.turns.exclude(state__in=TURN_CLOSED).first()


# --------------------------------------------------------------------------- runs


def continue_run(
    unit: Unit, run: Run, lease: Lease | None, *, incr: dict[str, Any] | None = None
) -> None:
    """The turn is closed: release the lease (a new turn starts from scratch) and wake a
    worker for the next turn."""
    old = None
    if run.state != RunState.RUNNING:
        old = move(run, RunState.RUNNING)
        unit.record(payloads.run_continued(run))
    unit.write_run(
        run,
        lease=lease,
        old_state=old,
        incr=incr,
        fields={**released(), "recovery_attempts": 0},
    )
    wake(unit, run.pk)


def complete_run(
    unit: Unit,
    run: Run,
    lease: Lease | None,
    stop_reason: str,
    output: dict[str, Any],
    *,
    incr: dict[str, Any] | None = None,
) -> None:
    old = move(run, RunState.COMPLETED)
    totals = {k: getattr(run, k) + (incr or {}).get(k, 0) for k in run.usage()}
    unit.record(payloads.run_completed(run, stop_reason, output, totals))
    unit.write_run(
        run,
        lease=lease,
        old_state=old,
        incr=incr,
        fields={
            **released(),
            "output": output,
            "stop_reason": stop_reason,
            "finished_at": timezone.now(),
        },
    )
    signal_after(unit, signals.run_finished, run=run, state=run.state)


def fail_run(
    unit: Unit,
    run: Run,
    lease: Lease | None,
    *,
    code: str,
    message: str,
    phase: str,
    turn: Turn | None = None,
) -> None:
    """End the run as failed with a structured error; an open turn fails with it."""
    message = storable_text(message)
    end_turn(unit, turn, TurnState.FAILED, f"Run failed ({code})")
    old = move(run, RunState.FAILED)
    checkpoint = run.last_seq
    unit.record(payloads.run_failed(run, code, message, phase, checkpoint))
    unit.write_run(
        run,
        lease=lease,
        old_state=old,
        fields={
            "error_code": code,
            "error_message": message,
            "failure_phase": phase,
            "last_checkpoint": checkpoint,
            "finished_at": timezone.now(),
            **released(),
        },
    )
    signal_after(unit, signals.run_finished, run=run, state=run.state)


def close_run(
    unit: Unit,
    run: Run,
    lease: Lease | None,
    target: str,
    reason: str,
    *,
    fields: dict[str, Any] | None = None,
    not_started: frozenset[Any] = frozenset(),
) -> None:
    """Cancel or time out a run: its open turn and calls close with synthetic results
    (completed outputs are kept). `not_started`: in_flight calls whose handler is known not
    to have started."""
    cancelled = target == RunState.CANCELLED
    text = f"Cancelled: {reason}" if cancelled else f"Timed out: {reason}"
    end_turn(unit, open_turn(run), TurnState.CANCELLED, text, not_started=not_started)
    old = move(run, target)
    unit.record(payloads.run_closed(run, reason))
    unit.write_run(
        run,
        lease=lease,
        old_state=old,
        fields={
            **(fields or {}),
            **released(),
            "stop_reason": target,
            "finished_at": timezone.now(),
        },
    )
    signal_after(unit, signals.run_finished, run=run, state=run.state)


def park(unit: Unit, run: Run, lease: Lease | None) -> None:
    """The run waits for a person: awaiting_approval, the lease given back."""
    old = move(run, RunState.AWAITING_APPROVAL)
    unit.record(payloads.run_parked(run))
    unit.write_run(run, lease=lease, old_state=old, fields=released())


def go_on_after_decision(unit: Unit, run: Run, call: ToolCall) -> None:
    """After a person's decision: when no call of the turn waits for one any more, the run
    goes on (awaiting_tool, a worker is woken); otherwise only the decision is written."""
    waiting = call.turn.tool_calls.pending_decision().exclude(pk=call.pk).exists()
    if run.state == RunState.AWAITING_APPROVAL and not waiting:
        old = move(run, RunState.AWAITING_TOOL)
        unit.record(payloads.run_continued(run))
        unit.write_run(run, old_state=old, fields=released())
        wake(unit, run.pk)
    else:
        unit.write_run(run)


def wake_again(unit: Unit, run: Run) -> None:
    """A run nobody picked up gets a new wake-up (the reaper), marking when."""
    now = DatabaseNow()
    fields: dict[str, Any] = (
        {"queued_at": now} if run.state == RunState.QUEUED else {"lease_expires_at": now}
    )
    unit.record(payloads.reaper_requeued(run))
    unit.write_run(run, fields=fields)
    wake(unit, run.pk)
