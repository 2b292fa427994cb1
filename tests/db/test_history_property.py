"""A property of the whole app: whatever happens to a conversation's history (answers with
thinking, tools that wait for approval, turns paused by a server tool, final turns, cancels,
rejections, replaced tool results, resumes, forks, interrupting and rolling-back
messages, follow-ups on another model or system prompt), every request it sends is one the Messages API stand-in accepts. Hypothesis
generates the histories; the stand-in validates each request through the real SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_agentrun import (
    Agent,
    cancel_run,
    fork_run,
    reject_tool_call,
    resume_run,
    send_message,
    server_tool,
    start_conversation,
)
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.exceptions import AgentRunError
from django_agentrun.models import Run, ToolCall
from django_agentrun.services import replace_tool_result
from django_agentrun.services.forks import fork_points
from django_agentrun.testing.messages_api import (
    MessagesAPIServer,
    Reply,
    server_tool_use,
    text,
    tool_use,
)
from tests.conftest import drive
from tests.testapp.agents import delete_account, lookup

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(600), pytest.mark.one_driver]

STOPPED = ("failed", "cancelled", "timed_out")
ANSWERS = ("lookup", "approval", "pause", "end")
OPS = (
    "message",
    "other_model",
    "other_system",
    "interrupt",
    "rollback",
    "cancel",
    "reject",
    "replace",
    "resume",
    "fork",
)


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(api_key="k") as server:
        yield server


@pytest.fixture
def client(api: MessagesAPIServer) -> Iterator[AnthropicModelClient]:
    client = AnthropicModelClient(base_url=api.base_url, api_key="k", max_retries=0)
    yield client
    client.close()


@pytest.fixture
def wanderer() -> Iterator[str]:
    Agent(
        "wanderer",
        model="claude-sonnet-5-5",
        thinking="adaptive",
        system="You wander.",
        tools=[lookup, delete_account],
        server_tools=[server_tool("web_search_20250305", max_uses=5)],
        max_turns=4,
    )
    yield "wanderer"
    unregister_agent("wanderer")


def answer(thinks: bool, kind: str) -> Reply:
    """One scripted answer (fresh ids each time)."""
    blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": "Hm."}] if thinks else []
    if kind == "lookup":
        return Reply([*blocks, tool_use("lookup", {"query": "q"})])
    if kind == "approval":
        return Reply([*blocks, tool_use("delete_account", {"user": "u"})])
    if kind == "pause":
        use = server_tool_use("web_search", {"query": "q"})
        return Reply([*blocks, text("Searching."), use], stop_reason="pause_turn")
    return Reply([*blocks, text("Done.")])


def settle(conversation: Any, client: Any) -> None:
    """Drive every run of the conversation (and the forks) that may go on, in order."""
    for _ in range(3):
        for run in Run.objects.filter(state="queued").order_by("created_at"):
            drive(run, client, limit=12)


@settings(
    max_examples=int(__import__("os").environ.get("AGENTRUN_PROPERTY_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    answers=st.lists(st.tuples(st.booleans(), st.sampled_from(ANSWERS)), max_size=40),
    ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 5)), min_size=1, max_size=8),
)
def test_every_request_of_any_history_is_accepted(api, client, wanderer, answers, ops):
    queue = list(answers)
    api.script = lambda body: answer(*queue.pop(0)) if queue else Reply([text("Done.")])
    seen = len(api.requests)
    conversation = start_conversation(wanderer)
    send_message(conversation, "Start.")
    settle(conversation, client)
    for n, (op, pick) in enumerate(ops):
        runs = list(Run.objects.filter(conversation=conversation).order_by("conversation_position"))
        latest = runs[-1]
        try:
            if op in ("other_model", "other_system"):
                # A follow-up whose snapshot differs (the model, the system prompt).
                run = send_message(conversation, f"Message {n}.")
                change = {"model": "claude-opus-5-5"} if op == "other_model" else {"system": "New."}
                Run.objects.filter(pk=run.pk).update(config={**run.config, **change})
            elif op in ("message", "interrupt", "rollback"):
                policy = None if op == "message" else op
                send_message(conversation, f"Message {n}.", policy=policy)
            elif op == "cancel":
                cancel_run(latest, reason="property")
            elif op == "reject":
                waiting = ToolCall.objects.filter(state="awaiting_approval").first()
                if waiting is not None:
                    reject_tool_call(waiting, by=None, reason="no")
            elif op == "replace":
                calls = list(ToolCall.objects.filter(run__state__in=STOPPED).order_by("pk"))
                closed = [c for c in calls if c.is_closed]
                if closed:
                    replace_tool_result(closed[pick % len(closed)], by=None, result="edited")
            elif op == "resume":
                stopped = [r for r in runs if r.state in STOPPED]
                if stopped:
                    resume_run(stopped[pick % len(stopped)])
            elif op == "fork":
                points = [p.turn for p in fork_points(runs[0]) if p.allowed]
                if points and runs[0].state in (*STOPPED, "completed"):
                    fork_run(runs[0], at_turn=points[pick % len(points)])
        except AgentRunError:
            pass  # refused by the service (a state it does not apply to): nothing written
        settle(conversation, client)
    refused = [r["error"] for r in api.requests[seen:] if r["status"] != 200]
    assert refused == []
