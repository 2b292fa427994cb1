"""Tool execution: the commit for the turn's next open call, in order: park for a person,
apply the recovery policy to a call a dead worker left in flight, put a call in flight, or
run an in-flight call's handler and record its outcome (with what follows it, endings.py).
A call's result and the next call's `in_flight` share one commit: both are durable before
that handler starts, which is all write-ahead needs."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from .. import transitions
from ..content import stored_result
from ..exceptions import InvalidContent, ToolCancelled, ToolError
from ..failpoints import failpoint
from ..models import ToolCall, Turn
from ..outcomes import Outcome, call_key
from ..states import ResultSource, SideEffect, ToolCallState
from ..store import send
from ..tools import Tool
from . import endings, policy
from .step import Commit, Leave, Step

logger = logging.getLogger(__name__)


def next_commit(step: Step, turn: Turn) -> Commit:
    """The commit for the first open call of `turn` (or closing the turn when none is)."""
    for call in step.calls_of(turn):
        if call.is_closed:
            continue  # replay: its result is recorded
        tool = step.tool(call.name)
        if call_key(call) in step.started:
            return run_call(step, turn, call, tool)
        if step.abort.aborted or step.deadline_passed():
            return endings.interruption(step)
        if call.state == ToolCallState.UNKNOWN:
            write = step.write()
            return Commit(write, endings.park_unknown(step, write, call, "", already=True))
        if call.state == ToolCallState.AWAITING_APPROVAL:
            write = step.write()
            return Commit(write, endings.park_for_approval(step, write, call, tool, already=True))
        if call.state == ToolCallState.IN_FLIGHT:
            return settle(step, turn, call, tool)
        return request(step, turn, call, tool)
    # Every call is closed but the turn is not (a person closed the last one): close it.
    write = step.write()
    transitions.complete_turn(write, turn)
    return Commit(write, endings.after_turn(step, write, turn))


def request(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Commit:
    """A requested call that could not start with the commit before it."""
    write = step.write()
    if tool is None:
        outcome = Outcome.synthetic(
            ToolCallState.ERRORED, f"Tool {call.name} is no longer available."
        )
        return close(step, write, turn, call, outcome)
    if not call.approved and tool.needs_approval(call.arguments, step.run):
        return Commit(write, endings.park_for_approval(step, write, call, tool))
    if tool.side_effect == SideEffect.ATOMIC:
        return run_atomic(step, turn, call, tool)
    endings.start(step, write, call)
    return Commit(write)


def close(
    step: Step,
    write: Any,
    turn: Turn,
    call: ToolCall,
    outcome: Outcome,
    *,
    extra: dict[str, Any] | None = None,
) -> Commit:
    """Record a call's outcome and fold in what follows it."""
    transitions.close_call(write, call, outcome, extra=extra)
    return Commit(write, endings.after_call(step, write, turn), ("tool.after_commit", call.name))


def run_call(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Commit:
    """Run an in_flight call's handler (its in_flight is durable) and record its outcome."""
    failpoint("tool.before_handler", call.name)
    if step.abort.aborted:  # no handler starts once a cancel (or a lost lease) is known
        return endings.interruption(step)
    key = call_key(call)
    step.started.discard(key)
    step.not_started.discard(key)
    if tool is None:  # gone between the commit and now: nothing ran
        outcome = Outcome.synthetic(
            ToolCallState.ERRORED, f"Tool {call.name} is no longer available."
        )
    else:
        outcome = invoke(step, tool, call)
    failpoint("tool.after_handler", call.name)
    if outcome.state == ToolCallState.CANCELLED and not step.abort.cancel_requested:
        # Stopped because this worker could not keep its lease, not by a cancel: its
        # outcome is unknown. Record nothing; recovery applies the side-effect policy.
        raise Leave(f"Run {step.run_id}: handler stopped ({step.abort.reason})", expire=True)
    return close(step, step.write(), turn, call, outcome)


def invoke(step: Step, tool: Tool, call: ToolCall) -> Outcome:
    """Run the handler; every way it ends becomes an outcome."""
    try:
        value = tool.invoke(step.context(call), call.arguments)
    except ToolCancelled as exc:
        # The handler had started: whatever it did before it stopped may have taken effect.
        text = (
            f"Cancelled while running: {exc}. The tool may have had its effect before it stopped."
        )
        return _executed(ToolCallState.CANCELLED, text, True)
    except InvalidContent as exc:  # e.g. a ToolResult with a bad block: the handler's bug
        return _executed(ToolCallState.ERRORED, bad_result(call, exc), True)
    except ToolError as exc:
        return _executed(ToolCallState.ERRORED, str(exc), True)
    except Exception as exc:  # noqa: BLE001 - a tool bug becomes an is_error result
        logger.exception(
            "Tool %s raised run_id=%s tool_call_id=%s", call.name, step.run_id, call.tool_call_id
        )
        text = f"Tool {call.name} failed with {type(exc).__name__}."
        return _executed(ToolCallState.ERRORED, text, True)
    try:
        return _executed(ToolCallState.SUCCEEDED, stored_result(value), False)
    except InvalidContent as exc:
        return _executed(ToolCallState.ERRORED, bad_result(call, exc), True)


def _executed(state: str, result: Any, is_error: bool) -> Outcome:
    return Outcome(state, result, is_error, ResultSource.EXECUTED)


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


def run_atomic(step: Step, turn: Turn, call: ToolCall, tool: Tool) -> Commit:
    """An ORM-only handler inside the transaction that records its result: exactly once.

    The run row is not locked while the handler runs (the heartbeat renews the lease
    meanwhile); the result's write is fenced by the lease like every other, so if the lease
    was lost the handler's writes roll back with it."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                outcome = invoke(step, tool, call)
                if outcome.is_error:
                    raise _RollBack(outcome)
        except _RollBack as rollback:
            outcome = rollback.outcome
        commit = close(step, step.write(), turn, call, outcome)
        send(commit.write)
    return Commit(commit.write, commit.then, commit.failpoint, sent=True)


def settle(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Commit:
    """The executor of this in_flight call died: apply the recovery policy (policy.py)."""
    decision = policy.decide(step, call, tool)
    write = step.write()
    if isinstance(decision, policy.Rerun):
        transitions.requeue_call(write, call, decision.policy)
        logger.info(
            "Recovered in-flight call %s (%s) run_id=%s",
            call.tool_call_id,
            decision.policy,
            step.run_id,
        )
        return Commit(write)
    if isinstance(decision, policy.Reconciled):
        outcome = Outcome(ToolCallState.SUCCEEDED, decision.result, False, ResultSource.RECONCILED)
        return close(step, write, turn, call, outcome, extra={"policy": "reconciled"})
    return Commit(write, endings.park_unknown(step, write, call, decision.reason, already=False))


def settle_only(step: Step, turn: Turn | None) -> Commit | None:
    """The reaper's step: the next in_flight call of the open turn to apply the policy to
    (no handler runs); None when none is left."""
    if turn is None:
        return None
    for call in step.calls_of(turn):
        if call.state == ToolCallState.IN_FLIGHT:
            return settle(step, turn, call, step.tool(call.name))
    return None


class _RollBack(Exception):  # noqa: N818 - control flow
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
