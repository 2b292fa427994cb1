"""Conversations at their edges: thinking blocks sent back under the prefix they were made
under (the stand-in checks it), the final-turn notice kept out of the system prompt, the
budget of a follow-up counting the history it sends, cache breakpoints of earlier
messages, resuming and forking runs of a conversation, and the reaper leaving a follow-up
alone while an earlier run holds it back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_agentrun import Agent, send_message, services, start_conversation, stop_conversation
from django_agentrun.agents import get_agent, unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine.guards import FINAL_TURN_NOTICE
from django_agentrun.exceptions import InvalidTransition
from django_agentrun.models import Conversation, Run, RunEvent
from django_agentrun.reaper import reap
from django_agentrun.testing.messages_api import (
    Reply,
    text,
    tool_use,
)
from tests.conftest import drive
from tests.factories import by_message

pytestmark = pytest.mark.django_db


@pytest.fixture
def claude(messages_api):
    c = AnthropicModelClient(base_url=messages_api.base_url, api_key="test-key")
    yield c
    c.close()


@pytest.fixture
def brief():
    """An agent with two turns a run: the second is the final one, with its notice."""
    agent = Agent(name="brief", system="Be brief.", tools=[get_agent("chat").tools["lookup"]])
    agent.max_turns = 2
    yield agent
    unregister_agent("brief")


def thinking(words: str) -> dict:
    return {"type": "thinking", "thinking": words}


def statuses(api) -> list[int]:
    return [r["status"] for r in api.requests]


THINKING_SCRIPT = {
    "Think.": [
        Reply([thinking("I should look."), tool_use("lookup", {"query": "q"})]),
        Reply([thinking("Found it."), text("The answer.")]),
    ],
    "And now?": [Reply([thinking("Still the same."), text("Same answer.")])],
}


# --------------------------------------------------------------------------- thinking


def test_thinking__blocks_go_back_unchanged_across_the_runs_of_a_conversation(messages_api, claude):
    messages_api.script = by_message(THINKING_SCRIPT)
    conversation = start_conversation("chat")
    first = send_message(conversation, "Think.")
    drive(first, claude)
    stored = first.turns.get(index=0).content[0]
    assert stored["type"] == "thinking" and stored["signature"]  # as the API signed it
    original = get_agent("chat")
    Agent(name="chat", system="A new system prompt.", tools=list(original.tools.values()))
    try:
        second = send_message(conversation, "And now?")
        drive(second, claude)
    finally:  # the agent as tests/testapp/agents.py defines it, its model included
        Agent(
            name="chat",
            model=original.model,
            system=original.system,
            tools=list(original.tools.values()),
            max_turns=original.max_turns,
        )
    # The conversation's snapshot, not the agent as registered now: the prefix holds.
    assert second.state == "completed", second.error_message
    history = messages_api.bodies[-1]["messages"]
    assert [b["type"] for b in history[1]["content"]] == ["thinking", "tool_use"]
    assert history[1]["content"][0] == stored
    assert statuses(messages_api) == [200, 200, 200]


def test_thinking__a_system_prompt_changed_mid_conversation_leaves_the_thinking_out(
    messages_api, claude
):
    messages_api.script = by_message(THINKING_SCRIPT)
    conversation = start_conversation("chat")
    drive(send_message(conversation, "Think."), claude)
    second = send_message(conversation, "And now?")
    # As if the run took the agent as registered later, with another system prompt.
    Run.objects.filter(pk=second.pk).update(config={**second.config, "system": "Changed."})
    drive(second, claude)
    # Every block was written after another system prompt: a preserved-thinking model would
    # refuse each one (the stand-in's 400: tests/pure/test_messages_api_thinking.py), an
    # earlier one (this agent's) strips earlier turns' thinking itself; none is sent.
    assert (second.state, second.error_message) == ("completed", "")
    sent = messages_api.bodies[-1]["messages"]
    assert [b["type"] for m in sent if m["role"] == "assistant" for b in m["content"]] == [
        "tool_use",
        "text",
    ]
    assert statuses(messages_api) == [200, 200, 200]


def test_thinking__the_final_turn_notice_is_not_in_the_system_prompt(messages_api, claude, brief):
    messages_api.script = by_message(THINKING_SCRIPT)
    conversation = start_conversation(brief)
    first = send_message(conversation, "Think.")
    drive(first, claude)
    assert (first.state, first.stop_reason) == ("completed", "max_turns")
    final = messages_api.bodies[-1]
    assert final["messages"][-1]["content"][-1] == {"type": "text", "text": FINAL_TURN_NOTICE}
    assert FINAL_TURN_NOTICE not in str(final["system"])
    # The final answer's thinking goes back in the next message's history, accepted.
    second = send_message(conversation, "And now?")
    drive(second, claude)
    assert second.state == "completed"
    assert FINAL_TURN_NOTICE not in str(messages_api.bodies[-1])
    assert statuses(messages_api) == [200, 200, 200]


# --------------------------------------------------------------------------- budget, breakpoints


def test_budget__a_follow_up_counts_the_history_it_sends(messages_api, claude):
    messages_api.script = by_message({"long": [Reply("Read it.")]})
    conversation = start_conversation("chat")
    drive(send_message(conversation, [text("long"), text("word " * 2000)]), claude)
    config = {**conversation.config, "budget": {"max_input_tokens": 1500}}
    Conversation.objects.filter(pk=conversation.pk).update(config=config)
    second = send_message(conversation, "Short question?")
    drive(second, claude)
    assert (second.state, second.error_code, second.failure_phase) == (
        "failed",
        "budget_exceeded",
        "pre_turn",
    )
    assert len(messages_api.requests) == 1  # the follow-up asked nothing


def test_breakpoints__only_the_newest_message_keeps_its_cache_control(messages_api, claude):
    cached = {"type": "ephemeral"}
    messages_api.script = by_message({f"m{n}": [Reply(f"r{n}")] for n in range(3)})
    conversation = start_conversation("chat")
    for n in range(3):
        message = [
            {"type": "text", "text": f"m{n}", "cache_control": cached},
            {"type": "text", "text": f"more {n}", "cache_control": cached},
        ]
        run = send_message(conversation, message)
        drive(run, claude)
        assert run.state == "completed", run.error_message
    body = messages_api.bodies[-1]
    marked = [b for m in body["messages"] for b in m["content"] if "cache_control" in b]
    assert [b["text"] for b in marked] == ["m2", "more 2"]  # 2 + tools + system = 4
    assert statuses(messages_api) == [200, 200, 200]


# --------------------------------------------------------------------------- resume, fork


def test_resume__only_the_last_run_of_a_conversation(messages_api, claude):
    messages_api.script = by_message({"One.": [Reply("1")], "Two.": [Reply("2")]})
    conversation = start_conversation("chat")
    first = send_message(conversation, "One.")
    stop_conversation(conversation)
    services.resume_run(first)  # the last one: resumed
    drive(first, claude)
    assert first.state == "completed"
    second = send_message(conversation, "Two.")
    with pytest.raises(InvalidTransition, match="a later run of its conversation follows it"):
        services.resume_run(first)
    third = send_message(conversation, "Three.", policy="rollback")  # rolls `second` back
    stop_conversation(conversation)
    second.refresh_from_db()
    assert (second.state, second.rolled_back) == ("cancelled", True)
    with pytest.raises(InvalidTransition, match="rolled back"):
        services.resume_run(second)
    services.resume_run(third)
    third.refresh_from_db()
    assert third.state == "queued"


def test_fork__a_follow_up_cannot_be_forked(messages_api, claude):
    messages_api.script = by_message({"One.": [Reply("1")], "Two.": [Reply("2")]})
    conversation = start_conversation("chat")
    first = send_message(conversation, "One.")
    drive(first, claude)
    second = send_message(conversation, "Two.")
    drive(second, claude)
    assert not any(p.allowed for p in services.fork_points(second))
    with pytest.raises(services.ForkRefused, match="earlier runs of its conversation"):
        services.fork_run(second, at_turn=0)
    fork = services.fork_run(first, at_turn=0)  # the first run's history is its own
    assert fork.conversation_id is None


# --------------------------------------------------------------------------- the reaper


def test_reaper__leaves_a_held_back_follow_up_alone_until_nothing_holds_it(
    messages_api, claude, no_broker
):
    messages_api.script = by_message(
        {"Delete bob.": [Reply([text("Deleting."), tool_use("delete_account", {"user": "b"})])]}
    )
    conversation = start_conversation("chat")
    parked = send_message(conversation, "Delete bob.")
    drive(parked, claude)
    held = send_message(conversation, "Later.")
    later = timezone.now() + timedelta(hours=1)
    for _ in range(3):  # an hour on, again and again: it is waiting for a person, not lost
        report = reap(now=later, stale_after=0, run_ids=[held.pk])
        assert report.findings == []
    assert not RunEvent.objects.filter(run=held, type="reaper_requeued").exists()

    # The earlier run ends, and its wake-up is lost (nothing here runs on_commit): the
    # reaper's next pass finds the follow-up, since nothing holds it back any more.
    services.cancel_run(parked)
    report = reap(now=later, stale_after=0, run_ids=[held.pk])
    assert [(f.run_id, f.kind, f.done) for f in report.findings] == [
        (str(held.pk), "not_picked_up", True)
    ]
    assert RunEvent.objects.filter(run=held, type="reaper_requeued").count() == 1


def test_tool_use_ids__reused_from_an_earlier_run_are_refused_and_kept_out(messages_api, claude):
    """tool_use ids are unique in a history, across runs too: an answer reusing one is
    recorded (and paid for) but never enters the conversation, which stays valid."""
    messages_api.script = by_message(
        {
            "One.": [Reply([tool_use("lookup", {"query": "a"}, id="toolu_same")]), Reply("1")],
            "Two.": [Reply([tool_use("lookup", {"query": "b"}, id="toolu_same")])],
            "Three.": [Reply("3")],
        }
    )
    conversation = start_conversation("chat")
    drive(send_message(conversation, "One."), claude)
    second = send_message(conversation, "Two.")
    drive(second, claude)
    assert (second.state, second.error_code) == ("failed", "invalid_model_output")
    assert second.tool_calls.count() == 0
    third = send_message(conversation, "Three.")
    drive(third, claude)
    assert third.state == "completed"
    assert statuses(messages_api) == [200, 200, 200, 200]
