"""The states of runs, turns and tool calls, and their transition tables.

The run table is the seed's, exactly, plus one documented extension: a run
deadline moves any active run to `timed_out`. The models declare one
django-fsm-2 transition per target state from these tables, so the tables are
the single source of truth (tests enumerate every ordered pair against them).
"""

from __future__ import annotations

from django.db import models


class RunState(models.TextChoices):
    QUEUED = "queued", "Queued"
    """Created, waiting for a worker to claim it."""
    RUNNING = "running", "Running"
    """A worker is calling the model or orchestrating the turn."""
    AWAITING_TOOL = "awaiting_tool", "Awaiting tool"
    """The turn's tool calls are recorded and being executed."""
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    """Paused on a person or a policy: a tool call waits for a decision."""
    COMPLETED = "completed", "Completed"
    """The goal or a stop condition was reached (terminal)."""
    FAILED = "failed", "Failed"
    """An unrecoverable error or an exhausted budget; can be resumed explicitly."""
    CANCELLED = "cancelled", "Cancelled"
    """Aborted by a caller; can be resumed explicitly."""
    TIMED_OUT = "timed_out", "Timed out"
    """Its deadline (run or approval) passed; can be resumed explicitly."""


class TurnState(models.TextChoices):
    RUNNING = "running", "Running"
    """Started: the model is being asked (no response recorded yet)."""
    AWAITING_TOOL = "awaiting_tool", "Awaiting tool"
    """The assistant message is recorded; its tool calls are not all closed."""
    COMPLETED = "completed", "Completed"
    """The response and every tool result are recorded."""
    CANCELLED = "cancelled", "Cancelled"
    """Closed by cancellation or a deadline; open tool calls got cancelled results."""
    FAILED = "failed", "Failed"
    """The model call failed for good (or a guard halted the run inside the turn)."""


class ToolCallState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    """The intent is committed; the handler has not started."""
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    """Waits for a person (or policy) to approve or reject it."""
    IN_FLIGHT = "in_flight", "In flight"
    """The handler may have started; a crash here leaves the outcome unknown."""
    UNKNOWN = "unknown", "Unknown"
    """Found in flight after a crash with no way to tell: waits for reconciliation or a person."""
    SUCCEEDED = "succeeded", "Succeeded"
    """Closed with the handler's (or reconciled, or a person's) result."""
    ERRORED = "errored", "Errored"
    """Closed with an is_error result (handler error, bad arguments, failed by a person)."""
    REJECTED = "rejected", "Rejected"
    """Closed: a person declined it (synthetic is_error result)."""
    SKIPPED = "skipped", "Skipped"
    """Closed: a guard intercepted it (synthetic is_error result)."""
    CANCELLED = "cancelled", "Cancelled"
    """Closed by cancellation or a deadline (synthetic cancelled result)."""


class ResultSource(models.TextChoices):
    EXECUTED = "executed", "Executed"
    """The handler ran and returned (or raised)."""
    RECONCILED = "reconciled", "Reconciled"
    """The tool's reconcile check found the outcome after a crash."""
    PERSON = "person", "Decided by a person"
    """A person recorded the outcome (mark done, fail, reject)."""
    SYNTHETIC = "synthetic", "Synthetic"
    """The runtime wrote it (guard, cancellation, deadline, bad arguments)."""


class SideEffect(models.TextChoices):
    READ_ONLY = "read_only", "Read only"
    """Safe to re-run after a crash."""
    IDEMPOTENT_WRITE = "idempotent_write", "Idempotent write"
    """Safe to re-run with the same ctx.idempotency_key."""
    NON_IDEMPOTENT = "non_idempotent", "Non-idempotent"
    """Never re-run blindly: reconciled by its check, or by a person."""
    ATOMIC = "atomic", "Atomic (ORM only)"
    """Writes only through the ORM, inside the transaction that records its result."""


class ConversationPolicy(models.TextChoices):
    """What becomes of a message sent while a run of its conversation is active (LangGraph's
    names for its multitask strategies)."""

    REJECT = "reject", "Reject"
    """Refused (the API's 409 `conversation_busy`)."""
    ENQUEUE = "enqueue", "Enqueue"
    """The new run starts once every earlier run of the conversation has ended (a run that
    waits for a person has not: its history has a tool_use without a result)."""
    INTERRUPT = "interrupt", "Interrupt"
    """The active runs are cancelled as `cancel_run` cancels them (closed calls keep their
    results, open ones get cancelled results); the new run starts on that history."""
    ROLLBACK = "rollback", "Roll back"
    """As interrupt, and the interrupted runs are left out of the history from then on
    (their side effects stay recorded in their events)."""


class ConversationStatus(models.TextChoices):
    """What a conversation is doing, derived from its runs (for a frontend to show)."""

    IDLE = "idle", "Idle"
    """No run is active; the last one completed (or there is none yet)."""
    BUSY = "busy", "Busy"
    """A run is queued or advancing."""
    WAITING = "waiting", "Waiting for a person"
    """A run waits for an approval or for a person to settle an unknown tool outcome."""
    INTERRUPTED = "interrupted", "Interrupted"
    """No run is active; the last one was cancelled (stopped, interrupted) or timed out."""
    FAILED = "failed", "Failed"
    """No run is active; the last one failed."""


_R = RunState
# Active states: a deadline may end them.
RUN_ACTIVE = frozenset({_R.QUEUED, _R.RUNNING, _R.AWAITING_TOOL, _R.AWAITING_APPROVAL})
# The states a claim takes a run in: queued, or released between the tasks that carry it.
RUN_CLAIMABLE = frozenset({_R.QUEUED, _R.RUNNING, _R.AWAITING_TOOL})


class RunPhase(models.TextChoices):
    """The reaper's classes of runs, stored beside the state (Run.phase): a commit that
    moves a run between running and awaiting_tool, as every turn does, leaves it alone, so
    the partial indexes that select by it are not written (docs/explanation/storage.md)."""

    QUEUED = "queued", "Queued"
    """queued: waiting for its first claim."""
    LEASED = "leased", "Leased"
    """running or awaiting_tool: a worker holds (or held, or is about to take) its lease."""
    PARKED = "parked", "Parked"
    """awaiting_approval: waiting for a person; nobody holds it."""
    FINISHED = "finished", "Finished"
    """completed, failed, cancelled, timed_out."""


_P = RunPhase
# A state's phase: the model's GeneratedField and the Postgres trigger of migration
# 0019_run_phase compute the same (tests/postgres/test_phase.py checks they agree).
RUN_PHASE: dict[str, str] = {
    _R.QUEUED: _P.QUEUED,
    _R.RUNNING: _P.LEASED,
    _R.AWAITING_TOOL: _P.LEASED,
    _R.AWAITING_APPROVAL: _P.PARKED,
    _R.COMPLETED: _P.FINISHED,
    _R.FAILED: _P.FINISHED,
    _R.CANCELLED: _P.FINISHED,
    _R.TIMED_OUT: _P.FINISHED,
}
# The phases of the active states (the deadline's partial index).
PHASES_ACTIVE = (_P.LEASED, _P.PARKED, _P.QUEUED)

RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    _R.QUEUED: frozenset({_R.RUNNING, _R.CANCELLED, _R.TIMED_OUT}),
    _R.RUNNING: frozenset(
        {
            _R.AWAITING_TOOL,
            _R.AWAITING_APPROVAL,
            _R.COMPLETED,
            _R.FAILED,
            _R.CANCELLED,
            _R.TIMED_OUT,
        }
    ),
    _R.AWAITING_TOOL: frozenset(
        {_R.RUNNING, _R.AWAITING_APPROVAL, _R.FAILED, _R.CANCELLED, _R.TIMED_OUT}
    ),
    _R.AWAITING_APPROVAL: frozenset({_R.AWAITING_TOOL, _R.RUNNING, _R.CANCELLED, _R.TIMED_OUT}),
    _R.COMPLETED: frozenset(),
    _R.FAILED: frozenset({_R.QUEUED}),
    _R.CANCELLED: frozenset({_R.QUEUED}),
    _R.TIMED_OUT: frozenset({_R.QUEUED}),
}

_T = TurnState
TURN_TRANSITIONS: dict[str, frozenset[str]] = {
    _T.RUNNING: frozenset({_T.AWAITING_TOOL, _T.COMPLETED, _T.CANCELLED, _T.FAILED}),
    _T.AWAITING_TOOL: frozenset({_T.COMPLETED, _T.CANCELLED, _T.FAILED}),
    _T.COMPLETED: frozenset(),
    _T.CANCELLED: frozenset(),
    _T.FAILED: frozenset(),
}

_C = ToolCallState
TOOL_CALL_CLOSED = frozenset({_C.SUCCEEDED, _C.ERRORED, _C.REJECTED, _C.SKIPPED, _C.CANCELLED})
TOOL_CALL_TRANSITIONS: dict[str, frozenset[str]] = {
    _C.REQUESTED: frozenset(
        {_C.AWAITING_APPROVAL, _C.IN_FLIGHT, _C.SUCCEEDED, _C.ERRORED, _C.SKIPPED, _C.CANCELLED}
    ),
    # Approval goes back to requested (then runs); rejection and cancellation close it.
    _C.AWAITING_APPROVAL: frozenset({_C.REQUESTED, _C.REJECTED, _C.CANCELLED}),
    # Recovery: requested (re-run allowed), unknown (ask a person), or closed.
    _C.IN_FLIGHT: frozenset({_C.REQUESTED, _C.UNKNOWN, _C.SUCCEEDED, _C.ERRORED, _C.CANCELLED}),
    # A person (or a later reconcile) resolves it: done, retry, fail; or cancellation.
    _C.UNKNOWN: frozenset({_C.REQUESTED, _C.SUCCEEDED, _C.ERRORED, _C.CANCELLED}),
    **{state: frozenset() for state in TOOL_CALL_CLOSED},
}


def sources_of(table: dict[str, frozenset[str]], target: str) -> list[str]:
    """Every state with an edge to `target` in `table`."""
    return sorted(source for source, targets in table.items() if target in targets)
