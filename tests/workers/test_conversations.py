"""Conversations with real workers: a follow-up waits for the run before it and is woken
when it ends; a message interrupts a worker's stream, rolls back a run whose tool runs a
child process, or interrupts a run waiting for an approval. Each time the worker notices
within a second or two, the next run starts by itself, and every request the stand-in
gets is valid."""

from __future__ import annotations

import time

from django_agentrun import send_message, start_conversation
from django_agentrun.models import Conversation, Run
from django_agentrun.testing.messages_api import Reply, text, tool_use
from tests.conftest import assert_conversation_projection_matches, assert_projection_matches
from tests.factories import by_message
from tests.processes import wait_for, wait_resting
from tests.testapp.agents import executions


def state(run: Run) -> str:
    run.refresh_from_db()
    return run.state


def check_history(api, conversation: Conversation) -> list[list[str]]:
    """Every request was valid, every run projects; the last request's history as texts."""
    assert [(r["status"], r["error"]) for r in api.requests if r["status"] != 200] == []
    for run in conversation.runs.all():
        assert_projection_matches(run)
    assert_conversation_projection_matches(conversation)
    return [
        [m["content"]]
        if isinstance(m["content"], str)
        else [b.get("text", b["type"]) for b in m["content"]]
        for m in api.bodies[-1]["messages"]
    ]


def test_enqueue__the_follow_up_starts_when_the_worker_ends_the_run(workers, messages_api):
    messages_api.script = by_message(
        {
            "Write a poem.": [Reply([text("roses " * 60)], delay=0.02, chunk_size=10)],
            "Now a title.": [Reply("Roses.")],
        }
    )
    workers.start()
    conversation = start_conversation("chat")
    poem = send_message(conversation, "Write a poem.")
    title = send_message(conversation, "Now a title.")
    wait_resting(title, timeout=40)
    assert (state(poem), state(title)) == ("completed", "completed")
    assert poem.finished_at <= title.started_at  # it waited its turn
    history = check_history(messages_api, conversation)
    assert history == [["Write a poem."], ["roses " * 60], ["Now a title."]]


def test_interrupt__a_stream_then_rollback__a_tool_with_a_child_process(workers, messages_api):
    messages_api.script = by_message(
        {
            "Write an essay.": [Reply([text("word " * 400)], delay=0.3, chunk_size=5)],
            "Sleep instead.": [Reply([tool_use("shell_sleep", {"seconds": 60})])],
            "Forget the sleep.": [Reply("Forgotten.")],
        }
    )
    workers.start(AGENTRUN_CANCEL_GRACE_SECONDS="1")
    conversation = start_conversation("chat")
    essay = send_message(conversation, "Write an essay.")
    wait_for(lambda: messages_api.requests, timeout=30, message="the stream")
    time.sleep(1.0)
    asked = time.monotonic()
    sleep = send_message(conversation, "Sleep instead.", policy="interrupt")
    wait_for(lambda: state(essay) == "cancelled", timeout=5, interval=0.05, message="cut")
    assert time.monotonic() - asked < 2.0
    assert essay.turns.get().content is None
    assert messages_api.wait_for(lambda: messages_api.disconnects >= 1, timeout=2)

    # The interrupted run's end woke the next; its tool runs a child process.
    wait_for(lambda: executions("shell_sleep"), timeout=30, message="the tool to start")
    time.sleep(0.5)
    asked = time.monotonic()
    last = send_message(conversation, "Forget the sleep.", policy="rollback")
    wait_for(lambda: state(sleep) == "cancelled", timeout=5, interval=0.05, message="stopped")
    assert time.monotonic() - asked < 2.0
    call = sleep.tool_calls.get()
    assert (sleep.rolled_back, call.state, call.is_error) == (True, "cancelled", True)

    wait_resting(last, timeout=30)
    assert state(last) == "completed"
    assert len(executions("shell_sleep")) == 1
    # The cut essay left its input only; the rolled-back run left nothing.
    assert check_history(messages_api, conversation) == [["Write an essay.", "Forget the sleep."]]


def test_interrupt__a_run_waiting_for_an_approval_and_the_one_queued_behind_it(
    workers, messages_api
):
    messages_api.script = by_message(
        {
            "Delete bob.": [
                Reply([text("Deleting."), tool_use("delete_account", {"user": "bob"})])
            ],
            "Never mind.": [Reply("Nothing deleted.")],
        }
    )
    workers.start()
    conversation = start_conversation("chat")
    parked = send_message(conversation, "Delete bob.")
    wait_resting(parked, timeout=30)
    assert state(parked) == "awaiting_approval"
    queued = send_message(conversation, "And then hi.")  # enqueue: waits behind it
    time.sleep(1.0)
    assert state(queued) == "queued"
    last = send_message(conversation, "Never mind.", policy="interrupt")
    wait_resting(last, timeout=30)
    assert (state(parked), state(queued), state(last)) == ("cancelled", "cancelled", "completed")
    assert executions("delete_account") == []
    history = check_history(messages_api, conversation)
    assert history == [
        ["Delete bob."],
        ["Deleting.", "tool_use"],
        ["tool_result", "And then hi.", "Never mind."],
    ]
