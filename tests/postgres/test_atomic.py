"""An atomic tool (ORM writes inside the transaction that records its result) whose lease
was lost while it ran: the step ends as lease lost, and the handler's writes roll back."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group
from django.db import connection, connections

from django_agentrun import Agent, SideEffect, ToolContext, start_run, tool
from django_agentrun.agents import unregister_agent
from django_agentrun.engine import Outcome, advance
from django_agentrun.testing import ScriptedClient, reply, text, tool_use


def _take_the_run(run_id) -> None:
    """Another holder takes the run (in its own connection): the epoch moves on."""

    def take() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE agentrun_run SET lease_owner = 'other', lease_epoch = lease_epoch + 1,"
                " lease_expires_at = now() + interval '1 minute' WHERE id = %s",
                [run_id],
            )
        connections.close_all()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()


@tool(side_effect=SideEffect.ATOMIC)
def tally(ctx: ToolContext, name: str) -> str:
    """Count (ORM only); meanwhile the run is taken."""
    Group.objects.create(name=f"tally-{name}")
    _take_the_run(ctx.run_id)
    return "counted"


@pytest.fixture
def agent():
    Agent(name="tallier", tools=[tally])
    yield
    unregister_agent("tallier")


@pytest.mark.no_projection_check  # the lease was taken by hand, without its events
def test_atomic_tool__lease_lost_while_it_ran__ends_as_lease_lost(postgres, agent):
    run = start_run("tallier", "Count.")
    model = ScriptedClient([reply(tool_use("tally", {"name": "a"})), reply(text("Done."))])
    assert advance(run.pk, client=model) == Outcome.LEASE_LOST
    assert not Group.objects.filter(name="tally-a").exists()  # rolled back with the result
    # Nothing of the call was committed: its new holder runs it (an atomic call: once).
    assert run.tool_calls.get().state == "requested"
