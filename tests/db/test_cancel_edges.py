"""A cancel is honoured at every edge of a step, and no handler starts once it is known:
the in_flight commit that reports it, the early start of the next call, a turn closing,
a reconcile check, a run parking. In process (the abort signal and the cancel request are
injected at each edge); real workers are in tests/workers."""

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
    start_run,
    tool,
)
from django_agentrun.abort import CANCEL_REQUESTED, AbortSignal
from django_agentrun.engine import Outcome, advance
from django_agentrun.failpoints import FailpointError
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.testing import Reply, ScriptedClient, reply, text, tool_use

pytestmark = pytest.mark.django_db

RAN: list[str] = []
ABORT: dict[str, AbortSignal] = {}


@pytest.fixture(autouse=True)
def _reset():
    RAN.clear()
    ABORT.clear()


def _cancel_from_inside(run) -> None:
    """What a person does while the worker is busy: the request lands, the worker's signal
    fires (as its heartbeat or its next commit would make it)."""
    cancel_run(getattr(run, "pk", run), reason="stop")
    if "signal" in ABORT:
        ABORT["signal"].abort(CANCEL_REQUESTED)


def _cancels(arguments, run) -> bool:
    cancel_run(run.pk, reason="stop")  # lands after the decision to run, before in_flight
    return False


def _cancels_then_parks(arguments, run) -> bool:
    cancel_run(run.pk, reason="stop")
    return True


@tool(side_effect=SideEffect.NON_IDEMPOTENT, requires_approval=_cancels)
def charge(amount: int) -> str:
    """Charge a card."""
    RAN.append("charge")
    return "charged"


@tool(side_effect=SideEffect.NON_IDEMPOTENT)
def charge_plain(amount: int) -> str:
    """Charge a card."""
    RAN.append("charge_plain")
    return "charged"


@tool(side_effect=SideEffect.READ_ONLY)
def look_and_cancel(ctx: ToolContext) -> str:
    """Look something up; meanwhile the person cancels."""
    RAN.append("look_and_cancel")
    cancel_run(ctx.run_id, reason="stop")
    return "found"


def _check_and_cancel(ctx: ToolContext, to: str) -> Reconciliation:
    _cancel_from_inside(ctx.run_id)
    return Reconciliation.done({"id": "m-1"})


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_check_and_cancel)
def notify(to: str) -> str:
    """Notify someone."""
    RAN.append("notify")
    return "m-1"


_not_done_checks: list[str] = []


def _never_happened(to: str) -> Reconciliation:
    _not_done_checks.append(to)
    return Reconciliation.not_done()


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_never_happened)
def transfer(to: str) -> str:
    """Transfer money."""
    RAN.append("transfer")
    return "ok"


@tool(side_effect=SideEffect.NON_IDEMPOTENT, requires_approval=_cancels_then_parks)
def wipe(target: str) -> str:
    """Wipe something (approval needed)."""
    RAN.append("wipe")
    return "wiped"


Agent(
    name="cancel-edges",
    model="claude-sonnet-4-6",
    tools=[charge, charge_plain, look_and_cancel, notify, transfer, wipe],
    max_turns=5,
)


def _run(*replies: Reply) -> tuple[Run, ScriptedClient]:
    return start_run("cancel-edges", "go"), ScriptedClient([*replies, reply(text("done"))])


def _advance_all(run, client, signal=None) -> list[str]:
    outcomes = []
    for _ in range(6):
        outcomes.append(advance(run.pk, client=client, abort=signal))
        if outcomes[-1] != Outcome.CONTINUED:
            break
    run.refresh_from_db()
    return outcomes


def test_in_flight_commit_reports_the_cancel__the_handler_never_starts():
    run, client = _run(reply(tool_use("charge", {"amount": 5})))
    _advance_all(run, client)
    assert RAN == []
    assert run.state == "cancelled"
    call = ToolCall.objects.get(run=run)
    assert call.state == "cancelled"
    assert "was not run" in call.result


def test_next_call_started_with_the_previous_result__not_run_after_the_cancel():
    run, client = _run(
        reply(tool_use("look_and_cancel", {}), tool_use("charge_plain", {"amount": 5}))
    )
    _advance_all(run, client)
    assert RAN == ["look_and_cancel"]
    assert run.state == "cancelled"
    first, second = ToolCall.objects.filter(run=run).order_by("position")
    assert first.result == "found"  # recorded before the cancel applied
    assert second.state == "cancelled" and "was not run" in second.result


def test_cancel_while_the_turn_closes__applied_at_once_not_left_for_the_sweep():
    signal = AbortSignal()
    ABORT["signal"] = signal
    run = start_run("cancel-edges", "go")

    def script(request):
        _cancel_from_inside(run)  # while the model answers
        return reply(tool_use("no_such_tool", {}))  # closed at once (unknown tool)

    outcome = advance(run.pk, client=ScriptedClient(script), abort=signal)
    run.refresh_from_db()
    assert outcome == Outcome.FINISHED
    assert run.state == "cancelled"
    assert run.lease_owner == ""


def test_cancel_during_a_reconcile_check__applied_with_the_reconciled_result(monkeypatch):
    run, client = _run(reply(tool_use("notify", {"to": "ann"})))
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_handler@notify=raise")
    with pytest.raises(FailpointError):
        _advance_all(run, client)
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    signal = AbortSignal()
    ABORT["signal"] = signal
    outcome = advance(run.pk, client=client, abort=signal)
    run.refresh_from_db()
    assert outcome == Outcome.FINISHED
    assert run.state == "cancelled"
    call = ToolCall.objects.get(run=run)
    assert (call.state, call.result_source) == ("succeeded", "reconciled")
    assert RAN == ["notify"]


def test_cancel_as_the_run_parks__applied_at_once():
    run, client = _run(reply(tool_use("wipe", {"target": "db"})))
    outcomes = _advance_all(run, client)
    assert outcomes[-1] == Outcome.FINISHED
    assert run.state == "cancelled"
    assert RAN == []
    assert ToolCall.objects.get(run=run).state == "cancelled"


def test_reconcile_says_not_done__a_new_attempt_each_time_within_the_cap(monkeypatch, settings):
    """Each crash leaves the call in flight; each check says it never happened: every new
    attempt follows its own check (it used to go to a person after the second)."""
    settings.AGENTRUN_MAX_RECOVERY_ATTEMPTS = 5
    _not_done_checks.clear()
    run, client = _run(reply(tool_use("transfer", {"to": "bob"})))
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.before_handler@transfer=raise")
    for _ in range(3):
        with pytest.raises(FailpointError):
            _advance_all(run, client)
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    _advance_all(run, client)
    assert run.state == "completed", (run.state, run.error_code)
    assert RAN == ["transfer"]
    assert len(_not_done_checks) == 3
    assert RunEvent.objects.filter(run=run, type="recovery").count() == 3
