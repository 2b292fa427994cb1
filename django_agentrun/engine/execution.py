"""Tool execution: for each open call of the turn, in order, replay what is recorded, park
for a person, recover what a dead worker left in flight, or commit `in_flight` and run the
handler, then commit its result. A call's result and the next call's `in_flight` share one
commit: both are durable before that handler starts, which is all write-ahead needs."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from django.db import transaction

from .. import transitions
from ..abort import CANCEL_REQUESTED
from ..content import stored_result
from ..exceptions import InvalidContent, LeaseLost, ToolCancelled, ToolError
from ..failpoints import failpoint
from ..models import Run, ToolCall, Turn
from ..states import ResultSource, RunState, SideEffect, ToolCallState, TurnState
from ..tools import Tool
from . import recover
from .step import Outcome, Step, StepEnded

logger = logging.getLogger(__name__)


def tools_step(step: Step, turn: Turn) -> None:
    for call in turn.calls:  # type: ignore[attr-defined]
        if call.is_closed:
            continue  # replay: its result is recorded
        tool = step.tool(call.name)
        if call is step.started:  # went in_flight with the previous call's result
            step.started = None
            run_handler(step, turn, call, tool)
            continue
        _check_abort(step)
        if call.state == ToolCallState.UNKNOWN:
            step.park_unknown(call, call.unknown_reason, already=True)
        if call.state == ToolCallState.AWAITING_APPROVAL:
            step.park_approval(call, tool, already=True)
        if call.state == ToolCallState.IN_FLIGHT:
            recover_call(step, turn, call, tool)
            if call.is_closed:
                continue
        if call.state == ToolCallState.REQUESTED:
            if tool is None:
                finish(
                    step,
                    turn,
                    call,
                    ToolCallState.ERRORED,
                    f"Tool {call.name} is no longer available.",
                    True,
                    ResultSource.SYNTHETIC,
                )
                continue
            if not call.approved and tool.needs_approval(call.arguments, step.run):
                step.park_approval(call, tool)
            _execute(step, turn, call, tool)
    # Every call is closed but the turn is not (a person closed the last one): close it.
    with step.tx():
        step.close_turn(turn)


def _check_abort(step: Step) -> None:
    if step.abort.aborted:
        step.interrupted()
    if step.deadline_passed():
        with step.tx():
            step.close(RunState.TIMED_OUT, "deadline passed")


def _invoke(step: Step, tool: Tool, call: ToolCall) -> tuple[str, Any, bool]:
    """Run the handler; every outcome becomes a (state, result, is_error) triple."""
    try:
        value = tool.invoke(step.context(call), call.arguments)
    except ToolCancelled as exc:
        return ToolCallState.CANCELLED, f"Cancelled while running: {exc}", True
    except InvalidContent as exc:  # e.g. a ToolResult with a bad block: the handler's bug
        return ToolCallState.ERRORED, bad_result(call, exc), True
    except ToolError as exc:
        return ToolCallState.ERRORED, str(exc), True
    except Exception as exc:  # noqa: BLE001 - a tool bug becomes an is_error result
        logger.exception(
            "Tool %s raised run_id=%s tool_call_id=%s", call.name, step.run_id, call.tool_call_id
        )
        return ToolCallState.ERRORED, f"Tool {call.name} failed with {type(exc).__name__}.", True
    try:
        return ToolCallState.SUCCEEDED, stored_result(value), False
    except InvalidContent as exc:
        return ToolCallState.ERRORED, bad_result(call, exc), True


def bad_result(call: ToolCall, exc: InvalidContent) -> str:
    logger.warning(
        "Tool %s returned an invalid result run_id=%s tool_call_id=%s: %s",
        call.name,
        call.run_id,
        call.tool_call_id,
        exc,
    )
    # It ran: a result that cannot be recorded must not look like a crash (that would run
    # it again), so the model is told, and the call closes.
    return (
        f"Tool {call.name} ran, but its result cannot be recorded or sent (a bug in the tool, "
        f"not in your call): {exc}"
    )


def _execute(step: Step, turn: Turn, call: ToolCall, tool: Tool) -> None:
    if tool.side_effect == SideEffect.ATOMIC:
        _execute_atomic(step, turn, call, tool)
        return
    with step.tx():
        _start(step, call)
        step.write()
    run_handler(step, turn, call, tool)


def _start(step: Step, call: ToolCall) -> None:
    transitions.start_call(step.work(), call)
    step.not_started.add(call.pk)


def _next_to_start(step: Step, turn: Turn) -> ToolCall | None:
    """The turn's next open call, if it may go in_flight in the commit that records the
    result before it: requested, its tool defined and not atomic, no approval needed, no
    abort or passed deadline."""
    if step.recover_only:  # the reaper's step runs no handler
        return None
    call = next((c for c in turn.calls if not c.is_closed), None)  # type: ignore[attr-defined]
    if call is None or call.state != ToolCallState.REQUESTED or step.abort.aborted:
        return None
    if step.deadline_passed():
        return None
    tool = step.tool(call.name)
    if tool is None or tool.side_effect == SideEffect.ATOMIC:
        return None
    try:
        if not call.approved and tool.needs_approval(call.arguments, step.run):
            return None
    except Exception:  # noqa: BLE001 - let the loop meet it, after this result commits
        return None
    return call


def run_handler(step: Step, turn: Turn, call: ToolCall, tool: Tool) -> None:
    """Run an in_flight call's handler and record its result."""
    failpoint("tool.before_handler", call.name)
    if step.abort.aborted:  # no handler starts once a cancel (or a lost lease) is known
        step.interrupted()
    step.not_started.discard(call.pk)
    state, result, is_error = _invoke(step, tool, call)
    failpoint("tool.after_handler", call.name)
    if state == ToolCallState.CANCELLED and step.abort.reason != CANCEL_REQUESTED:
        # Stopped because this worker could not keep its lease, not by a cancel: its
        # outcome is unknown. Record nothing; recovery applies the side-effect policy.
        raise LeaseLost(f"Run {step.run_id}: handler stopped ({step.abort.reason})")
    finish(step, turn, call, state, result, is_error, ResultSource.EXECUTED)
    failpoint("tool.after_commit", call.name)
    if state == ToolCallState.CANCELLED:
        step.interrupted()


def _execute_atomic(step: Step, turn: Turn, call: ToolCall, tool: Tool) -> None:
    """ORM-only handler inside the transaction that records its result: exactly once."""
    lease = step.lease
    with step.tx(atomic=True):
        # Lock the run row under the lease before running anything.
        if (
            lease is None
            or not Run.objects.select_for_update()
            .filter(pk=step.run_id, lease_epoch=lease.epoch, lease_owner=lease.owner)
            .exists()
        ):
            raise LeaseLost(f"Run {step.run_id}: lease lost before an atomic tool")
        try:
            with transaction.atomic():
                state, result, is_error = _invoke(step, tool, call)
                if is_error:
                    raise _RollbackTool(state, result)
        except _RollbackTool as rollback:
            state, result, is_error = rollback.state, rollback.result, True
        _record(step, turn, call, state, result, is_error, ResultSource.EXECUTED, early=False)


def finish(
    step: Step,
    turn: Turn,
    call: ToolCall,
    state: str,
    result: Any,
    is_error: bool,
    source: str,
    *,
    extra: dict[str, Any] | None = None,
) -> None:
    """Commit a call's result (with the next call's in_flight when it may start early);
    when it was the turn's last open call, close the turn too."""
    with step.tx():
        _record(step, turn, call, state, result, is_error, source, extra=extra)


def _record(
    step: Step,
    turn: Turn,
    call: ToolCall,
    state: str,
    result: Any,
    is_error: bool,
    source: str,
    *,
    extra: dict[str, Any] | None = None,
    early: bool = True,
) -> None:
    transitions.close_call(
        step.work(), call, state, result, is_error=is_error, source=source, extra=extra
    )
    if all(c.is_closed for c in turn.calls):  # type: ignore[attr-defined]
        step.close_turn(turn)
        return
    following = _next_to_start(step, turn) if early else None
    if following is not None:
        _start(step, following)
    step.write()
    step.started = following


def recover_call(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> None:
    """The executor of this in_flight call died: apply the recovery policy (recover.py)."""
    decision = recover.decide(step, call, tool)
    if isinstance(decision, recover.Rerun):
        with step.tx():
            transitions.requeue_call(step.work(), call, decision.policy)
            step.write()
        logger.info(
            "Recovered in-flight call %s (%s) run_id=%s",
            call.tool_call_id,
            decision.policy,
            step.run_id,
        )
    elif isinstance(decision, recover.Reconciled):
        finish(
            step,
            turn,
            call,
            ToolCallState.SUCCEEDED,
            decision.result,
            False,
            ResultSource.RECONCILED,
            extra={"policy": "reconciled"},
        )
    else:
        step.park_unknown(call, decision.reason)


def recover_only(step: Step, turn: Turn | None) -> NoReturn:
    """The reaper's step: apply the policy to in_flight calls (no handler runs), then give
    the lease back and wake a worker."""
    if turn is not None and turn.state == TurnState.AWAITING_TOOL:
        for call in turn.calls:  # type: ignore[attr-defined]
            if call.state == ToolCallState.IN_FLIGHT:
                recover_call(step, turn, call, step.tool(call.name))
    with step.tx():
        step.write(fields=transitions.released())
        step.released = True
        transitions.wake(step.work(), step.run_id)
    raise StepEnded(Outcome.CONTINUED)


class _RollbackTool(Exception):  # noqa: N818 - control flow
    def __init__(self, state: str, result: Any) -> None:
        self.state, self.result = state, result
