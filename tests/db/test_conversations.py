"""Conversations, in this process, against the Messages API stand-in through the real SDK
(which refuses any invalid history): a follow-up's history is the earlier runs'
transcripts then its input, and every policy (reject, enqueue, interrupt, rollback) keeps
it valid, whether the active run waits for an approval, runs a tool or is only queued.
(A tool cancelled while it runs and a stream cut short need a second thread or a worker:
tests/postgres/test_conversation_threads.py, tests/workers/test_conversations.py.)"""

from __future__ import annotations

import json

import pytest

from django_agentrun import (
    approve_tool_call,
    send_message,
    services,
    start_conversation,
    stop_conversation,
)
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine import Outcome, advance
from django_agentrun.exceptions import ConversationBusy, IdempotencyConflict, InvalidInput
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.testing.messages_api import Reply, error, text, tool_use
from tests.conftest import drive
from tests.factories import by_message
from tests.testapp.agents import DURING

pytestmark = pytest.mark.django_db


@pytest.fixture
def claude(messages_api):
    c = AnthropicModelClient(base_url=messages_api.base_url, api_key="test-key")
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    DURING.clear()


def assert_accepted(api, *, except_statuses: tuple[int, ...] = ()) -> None:
    """Every request the stand-in got was valid (answered 200), but scripted errors."""
    bad = [
        (r["status"], r["error"])
        for r in api.requests
        if r["status"] not in (200, *except_statuses)
    ]
    assert bad == [], bad


def last_messages(api) -> list[dict]:
    return api.bodies[-1]["messages"]


def texts(content) -> list[str]:
    return [content] if isinstance(content, str) else [b.get("text", b["type"]) for b in content]


DELETE = Reply([text("Deleting."), tool_use("delete_account", {"user": "bob"})])


# --------------------------------------------------------------------------- history


def test_follow_up__history_is_the_earlier_transcripts_then_the_input_and_context(
    messages_api, claude
):
    messages_api.script = by_message(
        {
            "Look up order 42.": [
                Reply([text("Looking."), tool_use("lookup", {"query": "42"})]),
                Reply("Order 42 shipped."),
            ],
            "And order 43?": [Reply("Shipped too.")],
        }
    )
    conversation = start_conversation("chat")
    first = drive_to_rest(send_message(conversation, "Look up order 42."), claude)
    second = send_message(conversation, "And order 43?", context="Today is 2025-03-01.")
    drive(second, claude)
    assert (first.state, second.state) == ("completed", "completed")

    body = messages_api.bodies[-1]
    assert [(m["role"], texts(m["content"])) for m in body["messages"]] == [
        ("user", ["Look up order 42."]),
        ("assistant", ["Looking.", "tool_use"]),
        ("user", ["tool_result"]),
        ("assistant", ["Order 42 shipped."]),
        ("user", ["And order 43?", "Today is 2025-03-01."]),
    ]
    # The context is part of the message, never of the system prompt (the snapshot's).
    assert [b["text"] for b in body["system"]] == ["You are a chat agent."]
    assert second.output["text"] == "Shipped too."
    assert_accepted(messages_api)

    # Read from the earlier rows, not copied: the follow-up holds its own turn only.
    assert list(second.turns.values_list("index", flat=True)) == [0]
    stored = json.dumps([e.payload for e in RunEvent.objects.filter(run=second)])
    assert "Order 42 shipped." not in stored and "Looking." not in stored
    created = RunEvent.objects.get(run=second, type="run_created").payload
    assert (created["conversation"], created["position"], created["context"]) == (
        str(conversation.pk),
        1,
        "Today is 2025-03-01.",
    )
    # Each assistant message records the model that produced it (the agent's: the stand-in
    # answers as the model asked for).
    models = set(Run.objects.values_list("turns__model", flat=True))
    assert models == {conversation.config["model"]} == {"claude-sonnet-4-6"}


def drive_to_rest(run: Run, client) -> Run:
    drive(run, client)
    return run


def test_follow_up__earlier_results_and_the_next_input_share_one_user_message(messages_api, claude):
    messages_api.script = by_message(
        {
            "Look it up.": [Reply([tool_use("lookup", {"query": "x"})]), error(400)],
            "Try again.": [Reply("Found it.")],
        }
    )
    conversation = start_conversation("chat")
    failed = drive_to_rest(send_message(conversation, "Look it up."), claude)
    assert (failed.state, failed.error_code) == ("failed", "model_error")
    drive_to_rest(send_message(conversation, "Try again."), claude)
    messages = last_messages(messages_api)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert texts(messages[-1]["content"]) == ["tool_result", "Try again."]  # results first
    assert_accepted(messages_api, except_statuses=(400,))
    assert messages_api.requests[-1]["status"] == 200


def test_follow_up__a_run_that_failed_before_answering_contributes_its_input(messages_api, claude):
    messages_api.script = by_message({"First.": [error(400)], "Second.": [Reply("Both.")]})
    conversation = start_conversation("chat")
    assert drive_to_rest(send_message(conversation, "First."), claude).state == "failed"
    assert drive_to_rest(send_message(conversation, "Second."), claude).state == "completed"
    assert [texts(m["content"]) for m in last_messages(messages_api)] == [["First.", "Second."]]
    assert messages_api.requests[-1]["status"] == 200


def test_follow_up__uses_the_conversations_snapshot_not_the_agent_as_now(messages_api, claude):
    from django_agentrun import Agent
    from django_agentrun.agents import get_agent, unregister_agent

    agent = Agent(name="changing", system="Version one.", tools=[get_agent("chat").tools["lookup"]])
    messages_api.script = by_message({"One.": [Reply("1")], "Two.": [Reply("2")]})
    try:
        conversation = start_conversation(agent)
        drive_to_rest(send_message(conversation, "One."), claude)
        Agent(name="changing", system="Version two.", tools=[])  # registered anew
        second = drive_to_rest(send_message(conversation, "Two."), claude)
    finally:
        unregister_agent("changing")
    assert second.state == "completed"
    body = messages_api.bodies[-1]
    assert [b["text"] for b in body["system"]] == ["Version one."]
    assert [t["name"] for t in body["tools"]] == ["lookup"]
    assert second.config == conversation.config


# --------------------------------------------------------------------------- enqueue, reject


def test_enqueue__the_follow_up_waits_for_an_approval_then_starts_after_the_run_ends(
    messages_api, claude, no_broker, django_capture_on_commit_callbacks
):
    messages_api.script = by_message(
        {"Delete bob.": [DELETE, Reply("Deleted.")], "Then say hi.": [Reply("Hi.")]}
    )
    conversation = start_conversation("chat")
    first = drive_to_rest(send_message(conversation, "Delete bob."), claude)
    assert first.state == "awaiting_approval"
    second = send_message(conversation, "Then say hi.")  # the default policy: enqueue

    # Its claim holds it back while the earlier run waits (its tool_use has no result).
    assert advance(second.pk, client=claude) == Outcome.NOT_CLAIMED
    second.refresh_from_db()
    assert (second.state, conversation.status) == ("queued", "waiting")

    call = ToolCall.objects.get(run=first)
    approve_tool_call(call, by=None, token=services.approval_token(call))
    with django_capture_on_commit_callbacks(execute=True):
        drive(first, claude)
    assert first.state == "completed"
    assert str(second.pk) in no_broker  # the run that ended woke it
    drive(second, claude)
    assert second.state == "completed"
    messages = last_messages(messages_api)
    assert texts(messages[-1]["content"]) == ["Then say hi."]
    assert texts(messages[-2]["content"]) == ["Deleted."]
    conversation.refresh_status()
    assert conversation.status == "idle"
    assert_accepted(messages_api)


def test_reject__refused_while_a_run_is_active(messages_api, claude):
    messages_api.script = by_message({"One.": [Reply("1")], "Two.": [Reply("2")]})
    conversation = start_conversation("chat", policy="reject")
    first = send_message(conversation, "One.")
    with pytest.raises(ConversationBusy, match="busy"):
        send_message(conversation, "Two.")
    with pytest.raises(ConversationBusy):
        send_message(conversation, "Two.", policy="reject")
    assert conversation.runs.count() == 1
    drive(first, claude)
    second = drive_to_rest(send_message(conversation, "Two."), claude)  # idle now: accepted
    assert second.state == "completed"
    assert_accepted(messages_api)


# --------------------------------------------------------------------------- interrupt, rollback


def test_interrupt__while_an_approval_waits(messages_api, claude):
    messages_api.script = by_message(
        {"Delete bob.": [DELETE], "Never mind. Hi!": [Reply("Hi, no deletion.")]}
    )
    conversation = start_conversation("chat")
    first = drive_to_rest(send_message(conversation, "Delete bob."), claude)
    second = send_message(conversation, "Never mind. Hi!", policy="interrupt")
    first.refresh_from_db()
    call = ToolCall.objects.get(run=first)
    assert (first.state, call.state, call.is_error) == ("cancelled", "cancelled", True)
    assert "interrupted by a new message" in call.result and "was not run" in call.result

    assert drive_to_rest(second, claude).state == "completed"
    messages = last_messages(messages_api)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    results, words = messages[-1]["content"][0], messages[-1]["content"][1]
    assert (results["type"], results["tool_use_id"], results["is_error"]) == (
        "tool_result",
        call.tool_call_id,
        True,
    )
    assert words == {"type": "text", "text": "Never mind. Hi!"}
    assert_accepted(messages_api)


def test_rollback__while_an_approval_waits(messages_api, claude):
    messages_api.script = by_message(
        {"Hello.": [Reply("Hi!")], "Delete bob.": [DELETE], "Forget that.": [Reply("Forgotten.")]}
    )
    conversation = start_conversation("chat")
    drive_to_rest(send_message(conversation, "Hello."), claude)
    parked = drive_to_rest(send_message(conversation, "Delete bob."), claude)
    third = send_message(conversation, "Forget that.", policy="rollback")
    parked.refresh_from_db()
    assert (parked.state, parked.rolled_back) == ("cancelled", True)
    drive(third, claude)
    assert [texts(m["content"]) for m in last_messages(messages_api)] == [
        ["Hello."],
        ["Hi!"],
        ["Forget that."],
    ]
    # What the rolled-back run did stays in its events, with who rolled it back for what.
    kinds = list(RunEvent.objects.filter(run=parked).values_list("type", flat=True))
    assert {"approval_requested", "run_cancelled", "run_rolled_back"} <= set(kinds)
    rolled = RunEvent.objects.get(run=parked, type="run_rolled_back").payload
    assert rolled["next_run"] == str(third.pk)
    assert_accepted(messages_api)


def _during_script(key: str, after: str) -> dict:
    return {
        key: [
            Reply(
                [
                    text("Two things."),
                    tool_use("during", {"name": "message"}),
                    tool_use("lookup", {"query": "second"}),
                ]
            )
        ],
        after: [Reply("On it.")],
    }


def test_interrupt__while_a_tool_runs(messages_api, claude, settings):
    """A message sent while a tool runs (here from the tool itself): the call keeps its
    result, the next one (not started) gets a cancelled result, the follow-up starts on
    that history. One call at a time (AGENTRUN_TOOL_CONCURRENCY 1): with the default, the
    two read-only calls start together as one batch."""
    settings.AGENTRUN_TOOL_CONCURRENCY = 1
    messages_api.script = by_message(_during_script("Do two things.", "Stop, do this."))
    conversation = start_conversation("chat")
    sent: list[Run] = []
    DURING["message"] = lambda: sent.append(
        send_message(conversation, "Stop, do this.", policy="interrupt")
    )
    first = drive_to_rest(send_message(conversation, "Do two things."), claude)
    assert first.state == "cancelled"
    ran, skipped = first.tool_calls.order_by("position")
    assert (ran.state, ran.result) == ("succeeded", "ran message")
    assert (skipped.state, skipped.is_error) == ("cancelled", True)
    assert "was not run" in skipped.result

    drive(sent[0], claude)
    assert sent[0].state == "completed"
    assert texts(last_messages(messages_api)[-1]["content"]) == [
        "tool_result",
        "tool_result",
        "Stop, do this.",
    ]
    assert_accepted(messages_api)


def test_rollback__while_a_tool_runs(messages_api, claude):
    messages_api.script = by_message(
        {"Hello.": [Reply("Hi!")], **_during_script("Do two things.", "Undo, do this.")}
    )
    conversation = start_conversation("chat")
    drive_to_rest(send_message(conversation, "Hello."), claude)
    sent: list[Run] = []
    DURING["message"] = lambda: sent.append(
        send_message(conversation, "Undo, do this.", policy="rollback")
    )
    rolled = drive_to_rest(send_message(conversation, "Do two things."), claude)
    assert (rolled.state, rolled.rolled_back) == ("cancelled", True)
    drive(sent[0], claude)
    assert [texts(m["content"]) for m in last_messages(messages_api)] == [
        ["Hello."],
        ["Hi!"],
        ["Undo, do this."],
    ]
    # Its side effect happened and stays recorded (and shown): the tool's result event.
    finished = RunEvent.objects.filter(run=rolled, type="tool_call_finished")
    assert [e.payload["result"] for e in finished.order_by("seq")][0] == "ran message"
    assert_accepted(messages_api)


def test_enqueue__while_a_tool_runs_the_run_finishes_first(messages_api, claude):
    script = _during_script("Do two things.", "Then this.")
    script["Do two things."].append(Reply("Both done."))
    messages_api.script = by_message(script)
    conversation = start_conversation("chat")
    sent: list[Run] = []
    DURING["message"] = lambda: sent.append(send_message(conversation, "Then this."))
    first = drive_to_rest(send_message(conversation, "Do two things."), claude)
    assert first.state == "completed"  # not disturbed: both calls ran
    assert [c.state for c in first.tool_calls.order_by("position")] == ["succeeded"] * 2
    drive(sent[0], claude)
    assert sent[0].state == "completed"
    assert [texts(m["content"]) for m in last_messages(messages_api)][-2:] == [
        ["Both done."],
        ["Then this."],
    ]
    assert_accepted(messages_api)


def test_interrupt__also_cancels_the_queued_follow_ups(messages_api, claude):
    messages_api.script = by_message({"Three.": [Reply("Answering three.")]})
    conversation = start_conversation("chat")
    one = send_message(conversation, "One.")
    two = send_message(conversation, "Two.")
    three = send_message(conversation, "Three.", policy="interrupt")
    assert set(Run.objects.filter(pk__in=[one.pk, two.pk]).values_list("state", flat=True)) == {
        "cancelled"
    }
    drive(three, claude)
    # Never answered, they contribute their inputs (as a run that failed before answering).
    assert [texts(m["content"]) for m in last_messages(messages_api)] == [
        ["One.", "Two.", "Three."]
    ]
    assert_accepted(messages_api)


def test_rollback__of_queued_runs_leaves_their_inputs_out(messages_api, claude):
    messages_api.script = by_message({"Three.": [Reply("Only three.")]})
    conversation = start_conversation("chat")
    send_message(conversation, "One.")
    send_message(conversation, "Two.")
    three = drive_to_rest(send_message(conversation, "Three.", policy="rollback"), claude)
    assert three.state == "completed"
    assert [texts(m["content"]) for m in last_messages(messages_api)] == [["Three."]]
    assert conversation.runs.filter(rolled_back=True, state="cancelled").count() == 2
    assert_accepted(messages_api)


# --------------------------------------------------------------------------- stop, status


def test_stop__cancels_the_active_run_and_the_queued_ones(messages_api, claude):
    messages_api.script = by_message({"Delete bob.": [DELETE]})
    conversation = start_conversation("chat")
    parked = drive_to_rest(send_message(conversation, "Delete bob."), claude)
    queued = send_message(conversation, "And then?")
    stop_conversation(conversation, reason="user pressed stop")
    for run in (parked, queued):
        run.refresh_from_db()
        assert (run.state, run.cancel_reason) == ("cancelled", "user pressed stop")
    conversation.refresh_status()
    assert conversation.status == "interrupted"
    events = RunEvent.objects.count()
    stop_conversation(conversation)  # nothing active: nothing changes
    assert RunEvent.objects.count() == events


def test_status__follows_the_runs(messages_api, claude):
    messages_api.script = by_message(
        {"Delete bob.": [DELETE], "Fail.": [error(400)], "Fine.": [Reply("Fine.")]}
    )
    conversation = start_conversation("chat")
    seen = [conversation.status]
    run = send_message(conversation, "Delete bob.")
    seen.append(_status(conversation))
    drive(run, claude)
    seen.append(_status(conversation))
    services.cancel_run(run)
    seen.append(_status(conversation))
    drive(send_message(conversation, "Fail."), claude)
    seen.append(_status(conversation))
    drive(send_message(conversation, "Fine."), claude)
    seen.append(_status(conversation))
    assert seen == ["idle", "busy", "waiting", "interrupted", "failed", "idle"]


def _status(conversation) -> str:
    conversation.refresh_status()
    return conversation.status


# --------------------------------------------------------------------------- idempotency


def test_idempotency__one_key_one_run_and_nothing_interrupted_twice(messages_api, claude):
    conversation = start_conversation("chat")
    first = send_message(conversation, "One.", idempotency_key="k1")
    second = send_message(conversation, "Two.", policy="interrupt", idempotency_key="k2")
    again = send_message(conversation, "Two.", policy="interrupt", idempotency_key="k2")
    assert again.pk == second.pk
    second.refresh_from_db()
    assert second.state == "queued"  # the repeat did not interrupt the run it created
    assert conversation.runs.count() == 2
    with pytest.raises(IdempotencyConflict):
        send_message(conversation, "Something else.", idempotency_key="k2")
    with pytest.raises(IdempotencyConflict):
        services.start_run("chat", "Two.", idempotency_key="k2")
    other = start_conversation("chat")
    with pytest.raises(IdempotencyConflict):
        send_message(other, "Two.", idempotency_key="k2")
    assert first.pk != second.pk


def test_bad_input__refused_before_anything_is_written():
    conversation = start_conversation("chat")
    for kwargs, match in [
        ({"input": ""}, "must not be empty"),
        ({"input": "hi", "policy": "later"}, "Unknown policy"),
        ({"input": "hi", "context": 3}, "context must be a string"),
        ({"input": "hi", "context": "a\x00b"}, "NUL"),
        ({"input": "hi", "metadata": [1]}, "metadata"),
    ]:
        with pytest.raises(InvalidInput, match=match):
            send_message(conversation, **kwargs)
    with pytest.raises(InvalidInput, match="Unknown policy"):
        start_conversation("chat", policy="whenever")
    assert Run.objects.count() == 0
    send_message(conversation, "hi", idempotency_key="k")
    with pytest.raises(InvalidInput, match="Unknown policy"):  # even when the key is known
        send_message(conversation, "hi", idempotency_key="k", policy="later")


def test_blank_context__is_no_context(messages_api, claude):
    messages_api.script = by_message({"Hi.": [Reply("Hello.")]})
    run = send_message(start_conversation("chat"), "Hi.", context=" \n ")
    drive(run, claude)
    assert run.context == "" and messages_api.bodies[-1]["messages"] == [
        {"role": "user", "content": "Hi."}
    ]
    assert_accepted(messages_api)


def test_storage__each_message_stores_its_own_run_only(messages_api, claude):
    """The history is read from the earlier rows: what a run stores (its rows and events)
    stays flat as the conversation grows, while what it sends grows."""
    said = [f"Message {n}." for n in range(8)]
    messages_api.script = by_message(
        {m: [Reply([tool_use("lookup", {"query": m})]), Reply(f"Answer to {m}")] for m in said}
    )
    conversation = start_conversation("chat")
    stored, sent = [], []
    for message in said:
        run = send_message(conversation, message)
        drive(run, claude)
        assert run.state == "completed"
        rows = [e.payload for e in RunEvent.objects.filter(run=run)]
        rows += list(run.turns.values_list("content", flat=True))
        rows += list(run.tool_calls.values_list("arguments", "result"))
        stored.append(len(json.dumps(rows)))
        sent.append(len(json.dumps(messages_api.bodies[-1]["messages"])))
    assert max(stored[1:]) <= 1.1 * min(stored[1:]), stored  # flat (ids, times aside)
    assert sent[-1] > 5 * sent[0], sent  # the history it sends grows
    assert_accepted(messages_api)
