"""Conversations on Postgres with a second thread: messages racing for one conversation
(one Idempotency-Key makes one run; positions never collide), and a message that
interrupts (or rolls back) a run whose worker is calling a tool or reading the model's
stream, noticed by its heartbeat. Every request the stand-in gets is valid."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_agentrun import send_message, start_conversation
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine import Outcome, advance
from django_agentrun.models import Run, ToolCall
from django_agentrun.services import conversations
from django_agentrun.testing.messages_api import Reply, text, tool_use
from tests import factories
from tests.conftest import drive
from tests.factories import by_message
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _wakeups(no_broker):
    """No worker here: the wake-ups are recorded, and the test drives the runs itself."""


@pytest.fixture
def claude(messages_api):
    c = AnthropicModelClient(base_url=messages_api.base_url, api_key="test-key")
    yield c
    c.close()


def all_at_once(n, target):
    """`target(i)` in n threads released together, each on its own connection; the
    results and errors by thread."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(i):
        try:
            barrier.wait(timeout=10)
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a thread hung (a deadlock?)"
    return results, errors


def in_background(target):
    """Run `target()` in a thread with its own connection; join() it later."""

    def body():
        try:
            target()
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def assert_valid(api) -> None:
    assert [(r["status"], r["error"]) for r in api.requests if r["status"] != 200] == []


# --------------------------------------------------------------------------- races


def test_one_idempotency_key__two_concurrent_requests_make_one_run(postgres, monkeypatch):
    owner = factories.user("ann")
    conversation = start_conversation("chat", owner=owner)
    looked_up = conversations.get_agent

    def slowly(*args, **kwargs):
        time.sleep(0.3)  # under the conversation's lock: the other request arrives meanwhile
        return looked_up(*args, **kwargs)

    monkeypatch.setattr(conversations, "get_agent", slowly)
    url = reverse("agentrun:conversation-messages", args=[conversation.pk])

    def post(i):
        client = Client()
        client.force_login(owner)
        response = client.post(
            url, {"input": "Once."}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
        )
        return response.status_code, response.json()["id"]

    results, errors = all_at_once(2, post)
    assert errors == [None, None]
    # Both may say 201 (each looked before the other had created it, as for runs): one run.
    assert {status for status, _ in results} <= {200, 201}
    assert len({run_id for _, run_id in results}) == 1
    assert Run.objects.filter(conversation=conversation).count() == 1


def test_concurrent_messages__each_its_own_position(postgres):
    conversation = start_conversation("chat")
    results, errors = all_at_once(4, lambda i: send_message(conversation, f"Message {i}."))
    assert errors == [None] * 4
    positions = sorted(r.conversation_position for r in results)
    assert positions == [0, 1, 2, 3]


# --------------------------------------------------------------------------- interrupting a worker


def test_interrupt__while_a_tool_runs_the_heartbeat_stops_it(postgres, messages_api, claude):
    messages_api.script = by_message(
        {
            "Wait a while.": [Reply([text("Waiting."), tool_use("slow", {"seconds": 30})])],
            "Stop waiting.": [Reply("Stopped.")],
        }
    )
    conversation = start_conversation("chat")
    first = send_message(conversation, "Wait a while.")
    worker = in_background(lambda: advance(first.pk, client=claude, heartbeat=True))
    wait_for(
        lambda: ToolCall.objects.filter(run=first, state="in_flight").exists(),
        timeout=20,
        message="the tool to run",
    )
    asked = time.monotonic()
    second = send_message(conversation, "Stop waiting.", policy="interrupt")
    worker.join(timeout=10)
    assert time.monotonic() - asked < 2.0
    first.refresh_from_db()
    call = first.tool_calls.get()
    assert (first.state, call.state, call.is_error) == ("cancelled", "cancelled", True)
    assert call.result.startswith("Cancelled while running")  # the tool saw ctx.cancelled
    assert "may have had its effect" in call.result  # it had started
    assert first.cancel_reason == "interrupted by a new message"

    drive(second, claude)
    assert second.state == "completed"
    last = messages_api.bodies[-1]["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result", "text"]
    assert last[0]["tool_use_id"] == call.tool_call_id and last[1]["text"] == "Stop waiting."
    assert_valid(messages_api)


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
def test_a_message_while_the_model_streams__cuts_the_stream(postgres, messages_api, claude, policy):
    messages_api.script = by_message(
        {
            "Hello.": [Reply("Hi.")],
            "Write an essay.": [Reply([text("word " * 400)], delay=0.2, chunk_size=5)],
            "Short, please.": [Reply("Short.")],
        }
    )
    conversation = start_conversation("chat")
    drive(send_message(conversation, "Hello."), claude)
    essay = send_message(conversation, "Write an essay.")
    worker = in_background(lambda: advance(essay.pk, client=claude, heartbeat=True))
    wait_for(lambda: len(messages_api.requests) == 2, timeout=20, message="the stream")
    time.sleep(0.5)
    second = send_message(conversation, "Short, please.", policy=policy)
    worker.join(timeout=10)
    essay.refresh_from_db()
    turn = essay.turns.get()
    assert (essay.state, turn.state, turn.content) == ("cancelled", "cancelled", None)
    assert messages_api.wait_for(lambda: messages_api.disconnects >= 1, timeout=2)

    drive(second, claude)
    assert second.state == "completed"
    inputs = [
        [b["text"] for b in m["content"]] if isinstance(m["content"], list) else [m["content"]]
        for m in messages_api.bodies[-1]["messages"]
    ]
    if policy == "interrupt":  # the cut answer left nothing: its input and the new one
        assert inputs == [["Hello."], ["Hi."], ["Write an essay.", "Short, please."]]
    else:
        assert inputs == [["Hello."], ["Hi."], ["Short, please."]]
    assert_valid(messages_api)


def test_enqueue__while_the_model_streams_the_follow_up_waits_its_turn(
    postgres, messages_api, claude, no_broker
):
    messages_api.script = by_message(
        {
            "Write an essay.": [Reply([text("word " * 40)], delay=0.05, chunk_size=5)],
            "Then a title.": [Reply("A title.")],
        }
    )
    conversation = start_conversation("chat")
    essay = send_message(conversation, "Write an essay.")
    worker = in_background(lambda: advance(essay.pk, client=claude, heartbeat=True))
    wait_for(lambda: messages_api.requests, timeout=20, message="the stream")
    title = send_message(conversation, "Then a title.")
    assert advance(title.pk, client=claude) == Outcome.NOT_CLAIMED  # held back
    worker.join(timeout=20)
    essay.refresh_from_db()
    assert essay.state == "completed"
    assert no_broker.count(str(title.pk)) == 2  # on sending it, and when the essay ended
    drive(title, claude)
    assert title.state == "completed"
    assert [m["role"] for m in messages_api.bodies[-1]["messages"]] == ["user", "assistant", "user"]
    assert_valid(messages_api)
