"""Guards against the local Messages API server, through the real SDK over HTTP.

The engine runs in this process (no durability claim here), the model client is
the real AnthropicModelClient, and the server rejects any invalid history.
"""

from __future__ import annotations

import pytest

from django_agentrun import start_run
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine.guards import FINAL_TURN_NOTICE
from django_agentrun.models import RunEvent
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.testapp.agents import executions

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]


@pytest.fixture
def client(messages_api):
    c = AnthropicModelClient(base_url=messages_api.base_url, api_key="test-key")
    yield c
    c.close()


def test_max_turns__final_turn_offers_no_tools_and_carries_the_notice(messages_api, client):
    messages_api.script = by_step(
        [Reply([tool_use("lookup", {"query": "a"})]), Reply([text("Best answer so far.")])]
    )
    run = start_run("two-turns", "Research a")
    drive(run, client)
    assert run.state == "completed"
    assert run.stop_reason == "max_turns"
    first, final = messages_api.bodies
    assert "tool_choice" not in first
    assert final["tool_choice"] == {"type": "none"}
    # In the last user message, after the tool results: never in the system prompt, which
    # must stay what it was when the history's thinking blocks were made.
    last = final["messages"][-1]
    assert last["role"] == "user" and last["content"][0]["type"] == "tool_result"
    assert last["content"][-1] == {"type": "text", "text": FINAL_TURN_NOTICE}
    assert "system" not in final and FINAL_TURN_NOTICE not in str(first)
    assert all(r["status"] == 200 for r in messages_api.requests)
    assert_projection_matches(run)


def test_max_turns__tool_use_on_the_final_turn_gets_errors_and_the_run_ends(
    messages_api, client, test_log
):
    messages_api.script = by_step(
        [
            Reply([tool_use("lookup", {"query": "a"})]),
            Reply([text("One more."), tool_use("lookup", {"query": "b"})], stop_reason="tool_use"),
        ]
    )
    run = start_run("two-turns", "Research a")
    drive(run, client)
    assert run.state == "completed" and run.stop_reason == "max_turns"
    last = run.tool_calls.get(turn_index=1)
    assert last.state == "skipped" and last.is_error and "turn limit" in last.result
    assert [e["query"] for e in executions("lookup")] == ["a"]
    assert_projection_matches(run)


def test_max_tool_calls_per_turn__calls_past_the_cap_get_errors(messages_api, client, test_log):
    messages_api.script = by_step(
        [
            Reply([tool_use("lookup", {"query": q}) for q in "abcd"]),
            Reply([text("done")]),
        ]
    )
    run = start_run("capped", "Look up four things")
    drive(run, client)
    assert run.state == "completed"
    calls = list(run.tool_calls.order_by("position"))
    assert [c.state for c in calls] == ["succeeded", "succeeded", "skipped", "skipped"]
    assert "at most 2 tool calls" in calls[2].result
    assert sorted(e["query"] for e in executions("lookup")) == ["a", "b"]
    # The server saw every tool_use answered, in order.
    results = messages_api.bodies[1]["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results] == [c.tool_call_id for c in calls]
    assert_projection_matches(run)


def test_repeated_call__nth_identical_call_is_intercepted(messages_api, client, test_log):
    def script(body):
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if step < 4:
            return Reply([tool_use("lookup", {"query": "same"})])
        return Reply([text("giving up on that")])

    messages_api.script = script
    run = start_run("test-agent", "Loop please")
    drive(run, client)
    assert run.state == "completed"
    calls = list(run.tool_calls.order_by("turn_index"))
    assert [c.state for c in calls] == ["succeeded", "succeeded", "skipped", "skipped"]
    assert "identical call" in calls[2].result and "different strategy" in calls[2].result
    assert len(executions("lookup")) == 2  # N-1 times for N = 3
    assert RunEvent.objects.filter(run=run, type="loop_detected").count() == 2
    assert_projection_matches(run)


def test_budget__breach_is_detected_before_the_request(messages_api, client):
    # Each response uses 1000 output tokens; the budget is 2500 and max_tokens 1000, so a
    # third request could breach: it is never sent.
    messages_api.script = lambda body: Reply(
        [tool_use("lookup", {"query": "x"})], usage={"output_tokens": 1000}
    )
    run = start_run("budgeted", "Spend")
    drive(run, client)
    assert run.state == "failed"
    assert run.error_code == "budget_exceeded" and run.failure_phase == "pre_turn"
    assert "max_output_tokens" in run.error_message
    assert len(messages_api.requests) == 2
    assert run.output_tokens == 2000
    assert_projection_matches(run)


def test_budget__cache_read_tokens_count_toward_their_own_limit(messages_api, client):
    messages_api.script = lambda body: Reply(
        [tool_use("lookup", {"query": "x"})],
        usage={"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 4000},
    )
    run = start_run("cache-budget", "Read cache")
    drive(run, client)
    assert run.state == "failed" and run.error_code == "budget_exceeded"
    assert "max_cache_read_tokens" in run.error_message
    assert run.cache_read_input_tokens == 4000
    assert len(messages_api.requests) == 1
    assert_projection_matches(run)


def test_budget__cache_creation_tokens_count_toward_the_cost(messages_api, client):
    # claude-sonnet-4-6: cache write $3.75/M. 10k cache-creation tokens a turn = $0.0375.
    messages_api.script = lambda body: Reply(
        [tool_use("lookup", {"query": "x"})],
        usage={"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 10_000},
    )
    run = start_run("cost-budget", "Write cache")
    drive(run, client)
    assert run.state == "failed" and run.error_code == "budget_exceeded"
    assert "max_cost_usd" in run.error_message
    assert run.cache_creation_input_tokens == 10_000
    assert float(run.cost_usd) == pytest.approx(0.0375 + (10 * 3 + 5 * 15) / 1e6, abs=1e-6)
    assert len(messages_api.requests) == 1
    assert_projection_matches(run)
