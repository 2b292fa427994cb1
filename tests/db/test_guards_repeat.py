"""The repeat guard: the Nth identical call (tool name + canonical arguments) within the
last AGENTRUN_REPEAT_WINDOW calls is intercepted, not only N in a row."""

from __future__ import annotations

import pytest

from django_agentrun import Agent, start_run
from django_agentrun.engine.guards import repeated
from django_agentrun.models import RunEvent, ToolCall
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive
from tests.testapp.agents import lookup

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = pytest.mark.one_driver

Agent(name="repeat-window-4", model="claude-sonnet-4-6", tools=[lookup], repeat_window=4)
Agent(name="repeat-window-5", model="claude-sonnet-4-6", tools=[lookup], repeat_window=5)
Agent(name="repeat-default", model="claude-sonnet-4-6", tools=[lookup])


def test_repeated__counts_within_the_window_itself_included():
    calls = ["a", "b", "a", "c"]
    assert repeated(calls, "a", threshold=3, window=5)  # a, b, a, c, a
    assert not repeated(calls, "a", threshold=3, window=4)  # b, a, c, a
    assert repeated(["a", "a"], "a", threshold=3, window=3)  # in a row
    assert repeated(["a", "a"], "a", threshold=3, window=1)  # a window below N counts as N
    assert not repeated(["a", "b"], "a", threshold=3, window=10)
    assert not repeated(["a", "a", "a"], "a", threshold=1, window=10)  # guard off


def _queries(*queries):
    return [reply(tool_use("lookup", {"query": q})) for q in queries] + [reply(text("Done."))]


def _states(run):
    return [(c.arguments["query"], c.state) for c in ToolCall.objects.filter(run=run)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "agent, intercepted",
    [("repeat-window-5", True), ("repeat-window-4", False)],
)
def test_window__the_third_identical_call_within_the_window_is_intercepted(agent, intercepted):
    run = start_run(agent, "look things up")
    drive(run, ScriptedClient(_queries("a", "b", "a", "c", "a")))
    assert run.state == "completed"
    last = "skipped" if intercepted else "succeeded"
    assert _states(run) == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("a", "succeeded"),
        ("c", "succeeded"),
        ("a", last),
    ]
    loops = RunEvent.objects.filter(run=run, type="loop_detected")
    assert loops.count() == int(intercepted)
    if intercepted:
        call = ToolCall.objects.get(run=run, position=0, turn_index=4)
        assert call.is_error and "within the last 5 calls" in call.result


@pytest.mark.django_db
def test_window__identical_calls_in_a_row_are_still_caught():
    run = start_run("repeat-window-4", "look it up")
    drive(run, ScriptedClient(_queries("a", "a", "a")))
    assert [state for _, state in _states(run)] == ["succeeded", "succeeded", "skipped"]


@pytest.mark.django_db
def test_window__the_setting_is_the_default_and_is_snapshotted(settings):
    settings.AGENTRUN_REPEAT_WINDOW = 5
    run = start_run("repeat-default", "look things up")
    assert run.config["repeat_window"] == 5
    settings.AGENTRUN_REPEAT_WINDOW = 2  # later changes do not alter a run's limits
    drive(run, ScriptedClient(_queries("a", "b", "a", "c", "a")))
    assert _states(run)[-1] == ("a", "skipped")
    assert start_run("repeat-window-4", "x").config["repeat_window"] == 4
