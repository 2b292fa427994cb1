"""What one advance of a run knows (`Step`), how it commits (`Step.tx`), and how it ends:
the run goes on, completes, fails, closes, or the step leaves on an interruption.

The other modules of the engine are the step's phases: claim.py decides at the claim,
model_turn.py asks the model and records the answer, intents.py turns tool_use blocks
into calls, execution.py runs them, recover.py applies the recovery policy; driver.py
runs a step from claim to release.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NoReturn

from django.utils import timezone

from .. import signals, transitions
from ..abort import CANCEL_REQUESTED, AbortSignal
from ..agents import Agent
from ..clients import ModelClient, get_model_client
from ..exceptions import LeaseLost
from ..models import Run, ToolCall, Turn
from ..states import RunState, TurnState
from ..store import Lease, Unit, unit
from ..tokens import approval_token
from ..tools import Tool, ToolContext
from .history import text_of

logger = logging.getLogger(__name__)


class Outcome:
    NOT_CLAIMED = "not_claimed"
    CONTINUED = "continued"
    PARKED = "parked"
    FINISHED = "finished"
    LEASE_LOST = "lease_lost"


class StepEnded(Exception):  # noqa: N818 - control flow, not an error
    """The step ended; its outcome is recorded (raised after the commit)."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class Step:
    """One advance of one run under its lease."""

    def __init__(
        self,
        run_id: Any,
        owner: str,
        abort: AbortSignal,
        client: ModelClient | None,
        *,
        recover_only: bool = False,
        steal_from: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.owner = owner
        self.abort = abort
        self._client = client
        self.recover_only = recover_only  # the reaper's step: recovery policy only, no handler
        self.steal_from = steal_from
        self.lease: Lease | None = None
        self.took_over = False
        self.run: Run
        self.turns: list[Turn] = []
        self.turn: Turn | None = None
        self.agent: Agent | None = None
        self.outcome = Outcome.CONTINUED
        self.stopped = False  # the claim already ended the step
        self.released = False  # the lease was given back by a write (or must not be)
        self.unit: Unit | None = None  # the unit of work open now (inside tx())
        self.started: ToolCall | None = None  # in_flight with the previous result, not run
        self.not_started: set[Any] = set()  # in_flight calls whose handler never ran
        self.interrupting = False

    # -- reading -------------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        return self.run.config

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            self._client = get_model_client()
        return self._client

    def tool(self, name: str) -> Tool | None:
        """The agent's tool of that name (None: no longer defined, or the agent is gone)."""
        return self.agent.tools.get(name) if self.agent else None

    def open_turn(self) -> Turn | None:
        turn = self.turns[-1] if self.turns else None
        if turn is not None and turn.state in (TurnState.RUNNING, TurnState.AWAITING_TOOL):
            return turn
        return None

    def context(self, call: ToolCall) -> ToolContext:
        """What the handler (or reconcile check) of `call` knows and cooperates through."""

        def beat() -> None:
            ToolCall.objects.filter(pk=call.pk).update(heartbeat_at=timezone.now())

        return ToolContext(
            run_id=self.run.pk,
            tool_call_id=call.tool_call_id,
            idempotency_key=call.idempotency_key,
            attempt=call.attempt,
            tool_name=call.name,
            abort=self.abort,
            heartbeat=beat,
        )

    def deadline_passed(self) -> bool:
        return self.run.deadline is not None and self.run.deadline <= timezone.now()

    # -- committing ----------------------------------------------------------------------

    @contextmanager
    def tx(self, *, atomic: bool = False) -> Iterator[Unit]:
        """A unit of work (`atomic` for one that locks rows first) that commits when the
        step ends inside it (StepEnded), then re-raises. A cancel request its writes saw
        fires the abort signal; an abort seen by then ends the step (`interrupted`)."""
        stop: StepEnded | None = None
        with unit(atomic=atomic) as work:
            self.unit = work
            try:
                yield work
            except StepEnded as exc:
                stop = exc
            finally:
                self.unit = None
        if work.cancel_requested:
            self.abort.abort(CANCEL_REQUESTED)
        if self.abort.aborted and not self.interrupting:
            if not self.released:
                # Seen by this commit or meanwhile: nothing more starts (no handler, no
                # turn); the step closes the run now.
                self.interrupted()
            elif (
                self.abort.reason == CANCEL_REQUESTED
                and self.run.state == RunState.AWAITING_APPROVAL
            ):
                # The cancel arrived as the run parked: nobody holds it now, so it applies
                # at once instead of waiting for a person. (A run released to go on is
                # cancelled by the worker that claims it next.)
                self._cancel_parked()
                raise StepEnded(Outcome.FINISHED) from None
        if stop is not None:
            raise stop

    def _cancel_parked(self) -> None:
        with unit(atomic=True) as work:
            run = Run.objects.select_for_update().get(pk=self.run_id)
            if run.state == RunState.AWAITING_APPROVAL:
                reason = run.cancel_reason or "cancelled"
                transitions.close_run(work, run, None, RunState.CANCELLED, reason)

    def work(self) -> Unit:
        """The unit of work open now (inside tx())."""
        assert self.unit is not None, "a write outside Step.tx()"
        return self.unit

    def write(self, **kwargs: Any) -> None:
        """The run write of the current unit, under the lease."""
        self.work().write_run(self.run, lease=self.lease, **kwargs)

    # -- endings -------------------------------------------------------------------------

    def go_on(self, *, incr: dict[str, Any] | None = None) -> NoReturn:
        """The turn is closed: release the lease, wake a worker for the next turn."""
        transitions.continue_run(self.work(), self.run, self.lease, incr=incr)
        self.released = True
        raise StepEnded(Outcome.CONTINUED)

    def close_turn(self, turn: Turn, *, incr: dict[str, Any] | None = None) -> None:
        """The turn's last call closed: complete the turn, then the run goes on (or ends on
        its final turn). Under an abort the turn closes and `tx` ends the step."""
        transitions.close_turn(self.work(), turn)
        if self.abort.aborted:
            self.write(incr=incr)
            return
        if turn.is_final:
            self.complete("max_turns", incr=incr)
        self.go_on(incr=incr)

    def complete(self, stop_reason: str, *, incr: dict[str, Any] | None = None) -> NoReturn:
        final = next((t for t in reversed(self.turns) if t.content), None)
        output = {
            "text": text_of(final.content if final else None),
            "content": final.content if final else [],
        }
        transitions.complete_run(self.work(), self.run, self.lease, stop_reason, output, incr=incr)
        self.released = True
        logger.info("Run completed run_id=%s stop_reason=%s", self.run.pk, stop_reason)
        raise StepEnded(Outcome.FINISHED)

    def fail(
        self,
        code: str,
        message: str,
        phase: str,
        *,
        turn: Turn | None = None,
        incr: dict[str, Any] | None = None,
    ) -> NoReturn:
        work = self.work()
        if incr:
            work.write_run(self.run, lease=self.lease, incr=incr)
        transitions.fail_run(
            work,
            self.run,
            self.lease,
            code=code,
            message=message,
            phase=phase,
            turn=turn or self.open_turn(),
        )
        self.released = True
        logger.warning("Run failed run_id=%s code=%s phase=%s", self.run.pk, code, phase)
        raise StepEnded(Outcome.FINISHED)

    def close(self, target: str, reason: str) -> NoReturn:
        """Cancel or time the run out (its open turn and calls close with synthetic results)."""
        transitions.close_run(
            self.work(),
            self.run,
            self.lease,
            target,
            reason,
            not_started=frozenset(self.not_started),
        )
        self.released = True
        raise StepEnded(Outcome.FINISHED)

    def park_unknown(self, call: ToolCall, reason: str, *, already: bool = False) -> NoReturn:
        """The call's outcome is unknown: it and the run wait for a person."""
        with self.tx():
            work = self.work()
            if not already:
                transitions.mark_unknown(work, call, reason)
            self._park()
            transitions.signal_after(
                work,
                signals.reconciliation_needed,
                run=self.run,
                tool_call=call,
                reason=call.unknown_reason,
            )
        raise StepEnded(Outcome.PARKED)

    def park_approval(
        self, call: ToolCall, tool: Tool | None, *, already: bool = False
    ) -> NoReturn:
        """The call needs a person's approval: it and the run wait, with a resume token."""
        with self.tx():
            work = self.work()
            token = ""
            if not already:
                timeout = (
                    tool.approval_timeout.total_seconds()
                    if tool and tool.approval_timeout
                    else None
                ) or self.config.get("approval_timeout_seconds")
                token = approval_token(call)
                payload = {
                    "tool": call.name,
                    "description": tool.description if tool else "",
                    "arguments": call.arguments,
                    "side_effect": str(call.side_effect),
                    "run_id": str(self.run_id),
                    "turn_index": call.turn_index,
                    "token": token,
                }
                deadline = timezone.now() + timedelta(seconds=timeout) if timeout else None
                transitions.ask_approval(work, call, payload, token, deadline)
            self._park()
            transitions.signal_after(
                work, signals.approval_requested, run=self.run, tool_call=call, token=token
            )
        raise StepEnded(Outcome.PARKED)

    def _park(self) -> None:
        transitions.park(self.work(), self.run, self.lease)
        self.released = True

    def interrupted(self) -> NoReturn:
        """The abort signal fired: a cancel request or a deadline (close the run cleanly),
        or a lost lease (leave, writing nothing)."""
        self.interrupting = True
        lease = self.lease
        with self.tx(atomic=True):
            run = Run.objects.select_for_update().get(pk=self.run_id)
            if lease is None or run.lease_epoch != lease.epoch or run.lease_owner != lease.owner:
                raise LeaseLost(f"Run {self.run_id}: lease lost")
            self.run = run
            if run.cancel_requested_at is not None:
                self.close(RunState.CANCELLED, run.cancel_reason or "cancelled")
            if self.deadline_passed():
                self.close(RunState.TIMED_OUT, "deadline passed")
        raise LeaseLost(f"Run {self.run_id}: aborted ({self.abort.reason})")
