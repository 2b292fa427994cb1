"""Tool execution: the commit for the turn's next open call, in order: park for a person,
apply the recovery policy to a call a dead worker left in flight, put a call in flight, or
run an in-flight call's handler and record how it ended (with what follows it: step.py's
table).
A call's result and the next call's `in_flight` share one commit: both are durable before
that handler starts, which is all write-ahead needs.

A batch: calls the model asked for together that are safe to run again (read-only,
idempotent writes: `tools.batch`) go in flight in one commit, their handlers run at once
(on AGENTRUN_TOOL_CONCURRENCY threads, this one included), and their results commit
together in one write. A crash before that write re-runs them all, which their class
allows; a result once committed is replayed, never re-run. `handle` is the one place a
call's handler is invoked, alone or in a batch."""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from .. import telemetry
from ..conf import agentrun_settings
from ..content import stored_result
from ..exceptions import InvalidContent, ToolCancelled, ToolError, stopping_cause
from ..failpoints import failpoint
from ..models import ToolCall, Turn
from ..outcomes import CallEnding
from ..states import TOOL_CALL_CLOSED, ResultSource, ToolCallState
from ..tools import Tool, ToolContext, batch
from . import policy
from .follows import FOLLOWS, At, Ended, commit_of, may_start
from .step import Commit, Sent, Step

logger = logging.getLogger(__name__)


def next_commit(step: Step, turn: Turn) -> Commit:
    """The commit for the first open call of `turn` (or closing the turn when none is)."""
    for call in step.calls_of(turn):
        if call.state in TOOL_CALL_CLOSED:
            continue  # replay: its result is recorded
        tool = step.tool(call.name)
        ended = _open_call(step, turn, call, tool)
        phase = FOLLOWS[At.OPEN_CALL, ended].carries[:1]
        if phase and phase[0] in PHASES:  # the work whose commit is next
            return PHASES[phase[0]](step, turn, call, tool)
        if ended is Ended.TOOL_GONE:
            ending = CallEnding.synthetic(
                ToolCallState.ERRORED, f"Tool {call.name} is no longer available."
            )
            return close(step, step.write(), turn, call, ending, At.OPEN_CALL, Ended.TOOL_GONE)
        ctx: dict[str, Any] = {"turn": turn, "call": call, "tool": tool}
        if ended is Ended.STARTS:  # with the requested calls after it that may run with it
            ctx["batch"] = batch(step.calls_of(turn), call, step.tool, step.run)
        return commit_of(step, step.write(), At.OPEN_CALL, ended, **ctx)
    # Every call is closed but the turn is not (a person closed the last one): close it.
    return commit_of(step, step.write(), At.OPEN_CALL, Ended.NONE_OPEN, turn=turn)


def _open_call(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Ended:
    """What the open call is: the table (step.FOLLOWS) says what its commit is."""
    if (call.turn_index, call.tool_call_id) in step.started:
        return Ended.BATCH_STARTED if len(_started(step, turn)) > 1 else Ended.STARTED_HERE
    if step.abort.aborted or step.deadline_passed():
        return Ended.INTERRUPTED
    if call.state == ToolCallState.UNKNOWN:
        return Ended.UNKNOWN
    if call.state == ToolCallState.AWAITING_APPROVAL:
        return Ended.AWAITING_APPROVAL
    if call.state == ToolCallState.IN_FLIGHT:
        return Ended.IN_FLIGHT_FOUND
    return may_start(step, call, tool)  # requested, and could not start with the commit before


def close(
    step: Step,
    write: Any,
    turn: Turn,
    call: ToolCall,
    ending: CallEnding,
    at: At,
    ended: Ended,
    *,
    extra: dict[str, Any] | None = None,
) -> Commit:
    """Record a call's ending and fold in what follows it."""
    ctx = {"turn": turn, "call": call, "ending": ending, "extra": extra}
    return commit_of(step, write, at, ended, ("tool.after_commit", call.name), **ctx)


def run_call(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Commit:
    """Run an in_flight call's handler (its in_flight is durable) and record its outcome."""
    ending = handle(step, call, tool)
    if ending is None:  # no handler starts once a cancel (or a lost lease) is known
        return commit_of(step, step.write(), At.HANDLER, Ended.INTERRUPTED)
    if _stopped(ending, step):
        # Stopped because this worker could not keep its lease, not by a cancel: its
        # outcome is unknown. Record nothing; recovery applies the side-effect policy.
        reason = f"Run {step.run_id}: handler stopped ({step.abort.reason})"
        return commit_of(step, step.write(), At.HANDLER, Ended.STOPPED, reason=reason)
    return close(step, step.write(), turn, call, ending, At.HANDLER, Ended.RESULT)


def run_batch(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Commit:
    """Run the handlers of a batch at once (their in_flight is durable, in one commit) and
    record their outcomes together, in one write."""
    calls = _started(step, turn)
    endings = at_once(step, calls)
    if step.failpoints:
        failpoint("tool.after_batch", calls[0].name)
    ran = [(c, e) for c, e in zip(calls, endings, strict=True) if e is not None]
    if not ran:  # none started: a cancel (or a lost lease) was known first
        return commit_of(step, step.write(), At.HANDLER, Ended.INTERRUPTED)
    if any(_stopped(e, step) for _, e in ran):
        # As for one call: record nothing (each is safe to run again, as recovery will).
        reason = f"Run {step.run_id}: handlers stopped ({step.abort.reason})"
        return commit_of(step, step.write(), At.HANDLER, Ended.STOPPED, reason=reason)
    # Calls that did not start (the abort came first) stay in flight: the loop meets
    # the interruption next, and says they never started.
    ctx = {"turn": turn, "endings": ran}
    return commit_of(
        step, step.write(), At.HANDLER, Ended.RESULTS, ("tool.after_commit", calls[0].name), **ctx
    )


def _started(step: Step, turn: Turn) -> list[ToolCall]:
    """The calls of `turn` this step put in flight whose handlers have not run."""
    return [c for c in step.calls_of(turn) if (c.turn_index, c.tool_call_id) in step.started]


def _stopped(ending: CallEnding, step: Step) -> bool:
    return ending.state == ToolCallState.CANCELLED and not step.abort.cancel_requested


def handle(step: Step, call: ToolCall, tool: Tool | None) -> CallEnding | None:
    """Invoke one in_flight call's handler, with its failpoints: how it ended, or None
    when it did not start (the abort signal fired first)."""
    if step.failpoints:
        failpoint("tool.before_handler", call.name)
    if step.before_effect():
        return None
    key = (call.turn_index, call.tool_call_id)
    step.started.discard(key)
    step.not_started.discard(key)
    if tool is None:  # gone between the commit and now: nothing ran
        ending = CallEnding.synthetic(
            ToolCallState.ERRORED, f"Tool {call.name} is no longer available."
        )
    else:
        ending = invoke(step, tool, call)
    if step.failpoints:
        failpoint("tool.after_handler", call.name)
    return ending


def at_once(step: Step, calls: list[ToolCall]) -> list[CallEnding | None]:
    """Handle `calls` at once: the first in this thread, the others on the pool's
    threads (each with its own database connection, closed as a request's would be, and
    this thread's context variables).
    Inside a transaction (a test's, an eager task's) they run here, one after another:
    another thread's connection would not see what that transaction wrote."""
    work = [(call, step.tool(call.name)) for call in calls]
    if connection.in_atomic_block or agentrun_settings.TOOL_CONCURRENCY < 2:
        return [handle(step, call, tool) for call, tool in work]
    # Each in a copy of this thread's context (contextvars: a trace's current span, say).
    futures: list[Future] = [
        _pool().submit(contextvars.copy_context().run, _in_thread, step, c, t) for c, t in work[1:]
    ]
    try:
        first = handle(step, *work[0])
    finally:
        rest = [f.result() for f in futures]  # every handler ends before the write
    return [first, *rest]


def _in_thread(step: Step, call: ToolCall, tool: Tool | None) -> CallEnding | None:
    close_old_connections()
    try:
        return handle(step, call, tool)
    finally:
        close_old_connections()


_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """This process's threads for batches (a forked worker child makes its own)."""
    key = (os.getpid(), agentrun_settings.TOOL_CONCURRENCY - 1)
    with _pools_lock:
        if key not in _pools:
            _pools[key] = ThreadPoolExecutor(key[1], thread_name_prefix="agentrun-tool")
        return _pools[key]


def tool_context(step: Step, call: ToolCall) -> ToolContext:
    """What the handler (or reconcile check) of `call` knows and cooperates through."""

    def beat() -> None:
        ToolCall.objects.filter(pk=call.pk).update(heartbeat_at=timezone.now())

    return ToolContext(
        run_id=step.run.pk,
        tool_call_id=call.tool_call_id,
        idempotency_key=call.idempotency_key,
        attempt=call.attempt,
        tool_name=call.name,
        abort=step.abort,
        heartbeat=beat,
        holder=step.owner,
    )


def invoke(step: Step, tool: Tool, call: ToolCall) -> CallEnding:
    """Run the handler in its `execute_tool` span; every way it ends becomes an outcome."""
    with telemetry.execute_tool(call, tool.side_effect) as span:
        ending = _invoke(step, tool, call)
        span.end(ending.state, ending.is_error, ending.result)
    return ending


def _invoke(step: Step, tool: Tool, call: ToolCall) -> CallEnding:
    try:
        value = tool.invoke(tool_context(step, call), call.arguments)
    except ToolCancelled as exc:
        # The handler had started: whatever it did before it stopped may have taken effect.
        text = (
            f"Cancelled while running: {exc}. The tool may have had its effect before it stopped."
        )
        return _executed(ToolCallState.CANCELLED, text, True)
    except InvalidContent as exc:  # e.g. a ToolResult with a bad block: the handler's bug
        return _executed(ToolCallState.ERRORED, bad_result(call, exc), True)
    except ToolError as exc:
        if exc.content is None:
            return _executed(ToolCallState.ERRORED, str(exc), True)
        return _stored(call, ToolCallState.ERRORED, exc.content, True)
    except Exception as exc:  # noqa: BLE001 - a tool bug becomes an is_error result
        stopping = stopping_cause(exc)
        if stopping is not None:
            # The process is being stopped, not the tool failing: the call stays in flight
            # and its recovery follows its side-effect class, as after any crash.
            raise stopping from exc
        logger.exception(
            "Tool %s raised run_id=%s tool_call_id=%s", call.name, step.run_id, call.tool_call_id
        )
        text = f"Tool {call.name} failed with {type(exc).__name__}."
        return _executed(ToolCallState.ERRORED, text, True)
    return _stored(call, ToolCallState.SUCCEEDED, value, False)


def _stored(call: ToolCall, state: str, value: Any, is_error: bool) -> CallEnding:
    """A handler's returned (or, with ToolError, raised) content as the call's result; an
    error result saying so when it cannot be recorded or sent."""
    try:
        return _executed(state, stored_result(value), is_error)
    except InvalidContent as exc:
        return _executed(ToolCallState.ERRORED, bad_result(call, exc), True)


def _executed(state: str, result: Any, is_error: bool) -> CallEnding:
    return CallEnding(state, result, is_error, ResultSource.EXECUTED)


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
    was lost the handler's writes roll back with it (LeaseLost: the step ends as any whose
    lease was lost)."""
    with transaction.atomic():
        with transaction.atomic():
            ending = invoke(step, tool, call)
            if ending.is_error:
                transaction.set_rollback(True)  # the handler's writes, not the result
        commit = close(step, step.write(), turn, call, ending, At.HANDLER, Ended.RESULT)
        step.store.send(commit.write, savepoint=True)
    commit.sent = Sent.WITH_ATOMIC_TOOL
    return commit


def settle(step: Step, turn: Turn, call: ToolCall, tool: Tool | None) -> Commit:
    """The executor of this in_flight call died: apply the recovery policy (policy.py)."""
    decision = policy.decide(step, call, tool, tool_context(step, call))
    telemetry.settled(call, type(decision).__name__.lower())
    write = step.write()
    if isinstance(decision, policy.Rerun):
        logger.info(
            "Recovered in-flight call %s (%s) run_id=%s",
            call.tool_call_id,
            decision.policy,
            step.run_id,
        )
        ctx = {"turn": turn, "call": call, "change": (decision.policy,)}
        ctx["calls"] = _in_flight_batch(step, turn, call) if decision.policy == "rerun" else None
        return commit_of(step, write, At.POLICY, Ended.RERUN, **ctx)
    if isinstance(decision, policy.Reconciled):
        ending = CallEnding(
            ToolCallState.SUCCEEDED, decision.result, False, ResultSource.RECONCILED
        )
        extra = {"policy": "reconciled"}
        return close(step, write, turn, call, ending, At.POLICY, Ended.RECONCILED, extra=extra)
    ctx = {"turn": turn, "call": call, "change": (decision.reason,)}
    return commit_of(step, write, At.POLICY, Ended.UNKNOWN, **ctx)


def _in_flight_batch(step: Step, turn: Turn, first: ToolCall) -> list[ToolCall]:
    """`first` and the in_flight calls after it (a batch a dead worker left) that may run
    again and together: requeued in one commit, they go in flight again as one batch."""
    calls, found = step.calls_of(turn), []
    for call in calls[next(i for i, c in enumerate(calls) if c is first) :]:
        tool = step.tool(call.name)
        if call.state != ToolCallState.IN_FLIGHT or tool is None:
            break
        if not tool.runs_together(call.arguments, step.run, call.approved):
            break
        found.append(call)
    return found or [first]


def settle_only(step: Step, turn: Turn | None) -> Commit | None:
    """The reaper's step: the next in_flight call of the open turn to apply the policy to
    (no handler runs); None when none is left."""
    if turn is None:
        return None
    for call in step.calls_of(turn):
        if call.state == ToolCallState.IN_FLIGHT:
            return settle(step, turn, call, step.tool(call.name))
    return None


PHASES = {
    "phase:run_call": run_call,
    "phase:run_batch": run_batch,
    "phase:settle": settle,
    "phase:run_atomic": run_atomic,
}
