"""A tool that returned after its run was stopped keeps its result (issue 25): the cancel
arrived while the handler ran and no live lease was seen (so it stopped the run at once,
closing the call with a synthetic "outcome unknown" result); the worker's result write is
then refused, and the result the tool returned is recorded on the call anyway."""

from __future__ import annotations

import pytest

from django_agentrun import cancel_run, start_run
from django_agentrun.models import RunEvent, ToolCall
from django_agentrun.reaper import reap
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.factories import expire
from tests.testapp.agents import DURING, executions


@pytest.fixture
def hook():
    yield DURING
    DURING.pop("late", None)


@pytest.mark.django_db(transaction=True)
def test_late_result__a_cancel_while_the_handler_ran_keeps_the_result(hook):
    run = start_run("chat", "Run the tool")

    def stop_it_meanwhile() -> None:
        expire(run)  # no live lease seen: the cancel stops the run at once
        cancel_run(run, reason="stopped meanwhile")

    hook["late"] = stop_it_meanwhile
    model = ScriptedClient([reply(tool_use("during", {"name": "late"})), reply(text("Done."))])
    drive(run, model)

    call = ToolCall.objects.get(run=run)
    assert run.state == "cancelled"
    assert (call.state, call.result, call.is_error, call.result_source) == (
        "cancelled",
        "ran late",
        False,
        "executed",
    )
    kinds = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
    assert kinds[-1] == "tool_result_replaced", kinds
    assert_projection_matches(run)


@pytest.mark.django_db(transaction=True)
def test_late_result__recovery_found_the_outcome_unknown_the_result_settles_it(hook, test_log):
    """The worker's lease ran out while a payment ran; the reaper took the run over and,
    with no way to tell, marked the call unknown for a person. Then the payment returned:
    its result closes the call (executed) and the run goes on, nobody asked."""
    run = start_run("late-payments", "Pay")

    def recovered_meanwhile() -> None:
        expire(run)
        reap()
        call = ToolCall.objects.get(run=run)
        assert call.state == "unknown"  # the outcome a person would have had to settle

    hook["late"] = recovered_meanwhile
    model = ScriptedClient([reply(tool_use("pay_during", {"name": "late"})), reply(text("Paid."))])
    drive(run, model)
    drive(run, model)  # the run was woken to go on

    call = ToolCall.objects.get(run=run)
    assert (call.state, call.result, call.result_source) == ("succeeded", "paid late", "executed")
    assert (run.state, run.output["text"]) == ("completed", "Paid.")
    assert len(executions("pay_during")) == 1
