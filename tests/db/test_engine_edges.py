"""The edges between the engine's commits, each where a review found the promise broken
(the engine's second pass): an abort that is not a cancel as a turn closes, a cancelled
call whose outcome is unknown, a cancel that arrives after another abort, a step stopped
by a lease it could not renew, and errors that would recur on every attempt. In process,
with the abort injected where the heartbeat would fire it; real workers are in
tests/workers/test_edges.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_agentrun import (
    Agent,
    Reconciliation,
    SideEffect,
    ToolContext,
    cancel_run,
    resolve_tool_call,
    resume_run,
    start_run,
    store,
    tool,
)
from django_agentrun.abort import LEASE_UNRENEWED, AbortSignal
from django_agentrun.clients import ModelResponse, Usage
from django_agentrun.engine import Outcome, advance
from django_agentrun.exceptions import InvalidInput
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.reaper import reap
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.factories import crashed_at, unknown

pytestmark = pytest.mark.django_db

SIGNAL: dict[str, AbortSignal] = {}
RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    SIGNAL.clear()
    RAN.clear()


@tool(side_effect=SideEffect.READ_ONLY)
def finish_late(ctx: ToolContext) -> str:
    """Returns normally, though the lease could not be renewed meanwhile."""
    RAN.append("finish_late")
    ctx.abort.abort(LEASE_UNRENEWED)  # what the heartbeat's watchdog does
    return "done"


@tool(side_effect=SideEffect.READ_ONLY)
def stopped_by_watchdog(ctx: ToolContext) -> str:
    """Stops cooperatively when the watchdog aborts (every attempt)."""
    RAN.append("stopped_by_watchdog")
    ctx.abort.abort(LEASE_UNRENEWED)
    ctx.raise_if_cancelled()
    return "never"


def _abort_then_cancel(arguments, run) -> bool:
    """As the run is about to park: the watchdog fires first, then a person cancels."""
    SIGNAL["signal"].abort(LEASE_UNRENEWED)
    cancel_run(run.pk, reason="stop")  # the lease is live: only the request is recorded
    SIGNAL["signal"].abort("cancel requested")  # the heartbeat sees it: kept, not masked
    return True


@tool(side_effect=SideEffect.NON_IDEMPOTENT, requires_approval=_abort_then_cancel)
def wire(amount: int) -> str:
    """Wire money (a person approves)."""
    RAN.append("wire")
    return "wired"


def _checked_under_abort(ctx: ToolContext, to: str) -> Reconciliation:
    ctx.abort.abort(LEASE_UNRENEWED)  # the watchdog fires while the check runs
    return Reconciliation.done({"id": "m-1"})


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_checked_under_abort)
def notify_once(ctx: ToolContext, to: str) -> str:
    """Notify someone."""
    RAN.append("notify_once")
    return "m-1"


Agent(
    name="edges",
    model="claude-sonnet-4-6",
    tools=[finish_late, stopped_by_watchdog, wire, notify_once],
    max_turns=5,
)


def _advance(run, client) -> str:
    SIGNAL["signal"] = AbortSignal()
    return advance(run.pk, client=client, abort=SIGNAL["signal"])


# --------------------------------------------------------------------------- 1


def test_turn_closed_under_an_abort_that_is_no_cancel__the_run_goes_on_with_it():
    """The turn's last handler returns after the watchdog aborted: its result is recorded
    and the turn closes with the run moving on (it used to stay awaiting_tool under a
    completed turn, and every later claim paid the model for a turn it could not record)."""
    client = ScriptedClient([reply(tool_use("finish_late", {})), reply(text("done"))])
    run = start_run("edges", "go")
    assert _advance(run, client) == Outcome.LEASE_LOST  # stopped after recording the result
    run.refresh_from_db()
    call = run.tool_calls.get()
    assert (call.state, call.result) == ("succeeded", "done")
    assert run.state == "running" and run.turns.get().state == "completed"
    assert run.lease_owner  # not released: it ran out, so the next claim counts a recovery
    assert _advance(run, client) == Outcome.FINISHED
    run.refresh_from_db()
    assert run.state == "completed"
    assert client.steps() == {0: 1, 1: 1}  # each model step asked once
    assert RAN == ["finish_late"]
    assert RunEvent.objects.filter(run=run, type="recovery").count() == 1
    assert_projection_matches(run)


def test_reaper_reconciles_under_an_abort__the_turn_closes_with_the_run_moving_on(monkeypatch):
    """The reaper's step: the reconcile check answers done as the watchdog aborts; the call's
    result, the turn's close and the run's move share one commit (the run used to stay
    awaiting_tool under a completed turn)."""
    from django_agentrun.engine import settle_in_flight

    script = [reply(tool_use("notify_once", {"to": "ann"})), reply(text("ok"))]
    client = ScriptedClient(script)
    run = crashed_at(monkeypatch, "tool.before_handler", client, agent="edges")
    assert settle_in_flight(run.pk) == Outcome.LEASE_LOST  # stopped once it had committed
    run.refresh_from_db()
    call = run.tool_calls.get()
    assert (call.state, call.result_source) == ("succeeded", "reconciled")
    assert (run.state, run.turns.get().state) == ("running", "completed")
    assert drive(run, client)[-1] == Outcome.FINISHED
    assert run.state == "completed"
    assert client.steps() == {0: 1, 1: 1}
    assert RAN == []  # never run: the check found its effect
    assert_projection_matches(run)


# --------------------------------------------------------------------------- 2


def test_unknown_outcome_cancelled__the_model_reads_that_it_may_have_run(monkeypatch):
    run, call, model = unknown(monkeypatch)  # charge_card: its outcome is unknown
    cancel_run(run, reason="customer left")
    call.refresh_from_db()
    assert call.state == "cancelled"
    assert "may have run" in call.result and "unknown" in call.result
    assert "was not run" not in call.result
    resume_run(run)
    drive(run, model)
    sent = model.requests[-1].messages[-1]["content"][0]
    assert sent["tool_use_id"] == call.tool_call_id and "may have run" in sent["content"]
    assert_projection_matches(run)


def test_unknown_outcome_timed_out__says_the_same(monkeypatch):
    run, call, _ = unknown(monkeypatch)
    Run.objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    reap(run_ids=[run.pk])
    call.refresh_from_db()
    assert call.state == "cancelled" and "may have run" in call.result
    resolve_ok = run.tool_calls.filter(state="unknown").exists()
    assert not resolve_ok
    assert_projection_matches(run)


def test_resolved_unknown_outcome_is_not_affected(monkeypatch):
    run, call, model = unknown(monkeypatch)
    from django_agentrun.tokens import approval_token

    resolve_tool_call(call, by=None, action="fail", note="declined", token=approval_token(call))
    call.refresh_from_db()
    assert call.state == "errored" and "may have run" not in call.result


# --------------------------------------------------------------------------- 5


def test_cancel_after_another_abort_as_the_run_parks__applied_not_masked():
    """The watchdog aborts first (lease not renewed), then a cancel request arrives, then
    the run parks for approval: the cancel applies at once (the abort's first reason used
    to mask it, leaving a run with a pending cancel waiting for a person)."""
    client = ScriptedClient([reply(tool_use("wire", {"amount": 5})), reply(text("done"))])
    run = start_run("edges", "go")
    assert _advance(run, client) == Outcome.FINISHED
    run.refresh_from_db()
    assert run.state == "cancelled"
    assert ToolCall.objects.get(run=run).state == "cancelled"
    assert RAN == []
    assert_projection_matches(run)


# --------------------------------------------------------------------------- 6


def test_stopped_by_an_unrenewable_lease__each_stop_is_a_recovery_bounded_by_the_cap(settings):
    """A handler stopped by the watchdog records nothing; the step lets its lease run out,
    so the next claim takes it over and counts a recovery (it used to release it: no count,
    no event, and such a loop had no end)."""
    settings.AGENTRUN_MAX_RECOVERY_ATTEMPTS = 2
    client = ScriptedClient([reply(tool_use("stopped_by_watchdog", {})), reply(text("done"))])
    run = start_run("edges", "go")
    outcomes = [_advance(run, client) for _ in range(6)]
    run.refresh_from_db()
    assert (run.state, run.error_code) == ("failed", "recovery_exhausted")
    assert outcomes[:3] == [Outcome.LEASE_LOST] * 3 and outcomes[3] == Outcome.FINISHED
    assert RunEvent.objects.filter(run=run, type="recovery").count() == 3
    assert len(RAN) == 3  # read_only: re-run after each recovery, never beside another
    assert client.steps() == {0: 1}
    assert_projection_matches(run)


def test_stopped_by_an_unrenewable_lease__a_renewal_of_the_holder_after_it_renews_nothing():
    """The step lets its lease run out; a renewal of the same holder that comes after it
    (its heartbeat's, held up by a row lock and answered after the step stopped) finds
    nothing to renew: the lease stays run out, and the wake-up's claim takes it over. Before,
    the renewal made the lease live for a whole lease again, and the claim went away."""
    client = ScriptedClient([reply(tool_use("stopped_by_watchdog", {})), reply(text("done"))])
    run = start_run("edges", "go")
    assert _advance(run, client) == Outcome.LEASE_LOST
    owner = Run.objects.values_list("lease_owner", flat=True).get(pk=run.pk)
    late = store.Lease(run.pk, owner, 1)  # the step's lease: the run's first claim
    assert store.renew_lease(late) == (False, False)
    assert Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk) <= (timezone.now())
    assert store.claim(run.pk, "other-host:1:x", history=False) is not None
    assert Run.objects.values_list("recovery_attempts", flat=True).get(pk=run.pk) == 1


# --------------------------------------------------------------------------- 7


LONE = "caf\udce9"  # what surrogateescape makes of the byte 0xe9


@pytest.mark.parametrize(
    "bad",
    [
        LONE,
        [{"type": "text", "text": LONE}],
        [
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "ok"},
                "title": LONE,
            }
        ],
    ],
)
def test_input_that_cannot_be_sent__refused_at_start_run(bad):
    with pytest.raises(InvalidInput, match="surrogate"):
        start_run("edges", bad)
    assert not Run.objects.exists()


class _Unencodable:
    """A client whose request cannot be sent: what the SDK raises for a lone surrogate."""

    calls = 0

    def create(self, request, *, abort):
        type(self).calls += 1
        LONE.encode("utf-8")
        return ModelResponse("msg", [], "end_turn", Usage())


def test_request_that_cannot_be_built_or_sent__fails_the_run_at_once():
    run = start_run("edges", "go")
    _Unencodable.calls = 0
    assert advance(run.pk, client=_Unencodable()) == Outcome.FINISHED
    run.refresh_from_db()
    assert (run.state, run.error_code, run.failure_phase) == (
        "failed",
        "model_request_failed",
        "model",
    )
    assert "UnicodeEncodeError" in run.error_message
    assert _Unencodable.calls == 1  # no retries, no recovery attempts
    assert run.recovery_attempts == 0
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert_projection_matches(run)


def test_tool_output_with_undecodable_bytes__stored_faithfully_sent_readably():
    client = ScriptedClient([reply(tool_use("echo_bytes", {})), reply(text("done"))])
    run = start_run("edges-bytes", "go")
    drive(run, client)
    assert run.state == "completed", (run.state, run.error_code, run.error_message)
    call = run.tool_calls.get()
    assert call.result == {"listing": LONE}  # faithfully
    sent = client.requests[-1].messages[-1]["content"][0]["content"]
    assert "\udce9" not in sent and "\ufffd" in sent  # readably: the replacement character
    sent.encode("utf-8")


@tool(side_effect=SideEffect.READ_ONLY)
def echo_bytes() -> dict:
    """Lists a directory whose names are not UTF-8."""
    return {"listing": LONE}


Agent(name="edges-bytes", model="claude-sonnet-4-6", tools=[echo_bytes])


def _stopped_inside() -> RuntimeError:
    """What a library makes of a SystemExit raised inside it (the process being stopped):
    another exception, chained from the stop."""
    try:
        try:
            raise SystemExit(-15)
        except SystemExit as stop:
            raise RuntimeError("the client library's call failed") from stop
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize("wrapped", ["chained", "named"])
def test_model_call__a_process_being_stopped_is_no_failure_of_the_run(wrapped):
    """A pool child that Celery terminates raises SystemExit wherever it is; pydantic-core
    wraps it in a SchemaError (naming it) when it lands in the SDK's lazy model build. The
    step stops with the process; the run is not failed (its lease brings it back)."""
    from django_agentrun.engine import advance
    from django_agentrun.models import Run
    from django_agentrun.testing import Reply, ScriptedClient

    class SchemaError(Exception):
        pass

    if wrapped == "chained":
        error = _stopped_inside()
    else:
        error = SchemaError("Error building `literal` serializer:\n  SystemExit: -241")
    run = start_run("test-agent", "hi")
    with pytest.raises(SystemExit):
        advance(run.pk, client=ScriptedClient([Reply([], error=error)]))
    run = Run.objects.get(pk=run.pk)
    assert run.state == "running" and not run.error_code


@tool(side_effect=SideEffect.NON_IDEMPOTENT)
def stopped_while_charging() -> dict:
    """Charges a card (its process is stopped while it does)."""
    raise _stopped_inside()


Agent(name="edges-stopped", model="claude-sonnet-4-6", tools=[stopped_while_charging])


def test_tool_call__a_process_being_stopped_is_no_error_of_the_tool():
    """A tool whose process is stopped mid-call (a SystemExit its library wrapped) is not
    closed as an is_error result the model would read as "it failed": the call stays in
    flight, and its recovery follows its side-effect class, as after any crash."""
    run = start_run("edges-stopped", "charge it")
    client = ScriptedClient([reply(tool_use("stopped_while_charging", {}))])
    with pytest.raises(SystemExit):
        advance(run.pk, client=client)
    call = ToolCall.objects.get(run=run)
    assert call.state == "in_flight" and call.result is None
    run = Run.objects.get(pk=run.pk)
    assert run.state == "awaiting_tool" and not run.error_code
