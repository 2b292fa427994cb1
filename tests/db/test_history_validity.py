"""Requests that stay valid after the history changes (issue #24): cache breakpoints
within the API's limit and TTL order with the host's own markers, thinking blocks left out
from the first point the history changed (a replaced tool result, a follow-up on another
model or system prompt), kept where it did not (a fork, a rollback), a paused server-tool
turn closed when the run ends right after it, and no prefill when a run is resumed after
invalid_structured_output. Each through the engine, the real `anthropic` SDK and the
Messages API stand-in, which refuses each of those requests as the API does: every request
here must be answered 200."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_agentrun import (
    Agent,
    cancel_run,
    fork_run,
    resume_run,
    send_message,
    server_tool,
    start_conversation,
    start_run,
)
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine.history import RESUME_NOTICE
from django_agentrun.models import Run, ToolCall
from django_agentrun.services import replace_tool_result
from django_agentrun.services.forks import fork_points
from django_agentrun.testing.messages_api import (
    MessagesAPIServer,
    Reply,
    by_step,
    server_tool_use,
    text,
    tool_use,
)
from tests.conftest import drive
from tests.factories import by_message
from tests.testapp.agents import delete_account, lookup

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60), pytest.mark.one_driver]


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(api_key="k") as server:
        yield server


@pytest.fixture
def client(api: MessagesAPIServer) -> Iterator[AnthropicModelClient]:
    client = AnthropicModelClient(base_url=api.base_url, api_key="k", max_retries=0)
    yield client
    client.close()


@pytest.fixture
def agent() -> Iterator[Any]:
    names: list[str] = []

    def define(name: str, **options: Any) -> Agent:
        names.append(name)
        options.setdefault("model", "claude-sonnet-4-5")
        return Agent(name, **options)

    yield define
    for name in names:
        unregister_agent(name)


def statuses(api: MessagesAPIServer) -> list[int]:
    return [r["status"] for r in api.requests]


def refusals(api: MessagesAPIServer) -> list[str]:
    return [r["error"] for r in api.requests if r["status"] != 200]


def thought(words: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": words}


def kinds(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    return ["text"] if isinstance(content, str) else [b["type"] for b in content]


def markers(body: dict[str, Any]) -> list[str]:
    """The TTL of each breakpoint of a request, in the API's order."""

    def walk(value: Any) -> list[str]:
        if isinstance(value, list):
            return [t for v in value for t in walk(v)]
        if not isinstance(value, dict):
            return []
        own = [value["cache_control"].get("ttl", "5m")] if value.get("cache_control") else []
        return own + walk(value.get("content"))

    system = body.get("system")
    top = [body["cache_control"].get("ttl", "5m")] if body.get("cache_control") else []
    return [
        *walk(body.get("tools") or []),
        *walk(system if isinstance(system, list) else []),
        *walk(body["messages"]),
        *top,
    ]


# --------------------------------------------------------------------------- breakpoints


def test_breakpoints__host_markers_in_system_input_and_tools_leave_at_most_four(api, client, agent):
    """The issue's five: a tool that may wait for approval (1 hour), a system block and an
    input block the host marked itself. The app's markers give way; 1 hour before 5 minutes."""
    agent(
        "marked",
        system=[{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        tools=[lookup, delete_account],
        server_tools=[server_tool("web_search_20250305", max_uses=1)],
    )
    api.script = by_step([Reply([tool_use("lookup", {"query": "q"})]), Reply([text("Done.")])])
    marked = [{"type": "text", "text": "Look.", "cache_control": {"type": "ephemeral"}}]
    run = start_run("marked", marked)
    drive(run, client)
    assert run.state == "completed", refusals(api)
    assert statuses(api) == [200, 200]
    for body in api.bodies:
        assert len(markers(body)) <= 4
        assert markers(body) == ["1h", "5m", "5m", "5m"]  # tools', system, input, moving


def test_breakpoints__no_room_left_by_the_host_no_marker_of_the_apps(api, client, agent):
    system = [
        {"type": "text", "text": f"Rule {i}.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        for i in range(4)
    ]
    agent("crowded", system=system, tools=[lookup])
    api.script = by_step([Reply([text("Done.")])])
    run = start_run("crowded", "Hello.")
    drive(run, client)
    assert run.state == "completed", refusals(api)
    assert markers(api.bodies[0]) == ["1h"] * 4


def test_breakpoints__check_warns_about_an_agent_that_leaves_the_app_no_room(agent):
    from django_agentrun.checks import check_agents

    marked = [
        {"type": "text", "text": f"Rule {i}.", "cache_control": {"type": "ephemeral"}}
        for i in range(3)
    ]
    agent("roomy", system=marked[:2], tools=[lookup])
    agent(
        "full",
        system=marked,
        tools=[lookup],
        server_tools=[
            {**server_tool("web_search_20250305"), "cache_control": {"type": "ephemeral"}}
        ],
    )
    found = [m for m in check_agents() if m.id == "agentrun.W040"]
    assert [m.obj for m in found] == ["full"]
    assert "at most 4 breakpoints" in found[0].msg and found[0].hint


# --------------------------------------------------------------------------- thinking


TWO_LOOKUPS = [
    Reply([thought("Look first."), tool_use("lookup", {"query": "a"})]),
    Reply([thought("Then delete."), tool_use("delete_account", {"user": "u"})]),
    Reply([thought("Now answer."), text("Done.")]),
]


def test_thinking__after_replace_tool_result_left_out_from_the_changed_result_on(
    api, client, agent
):
    agent("thinker", tools=[lookup, delete_account])
    api.script = by_step(TWO_LOOKUPS)
    run = start_run("thinker", "Clean up.")
    drive(run, client)
    assert run.state == "awaiting_approval"
    cancel_run(run, reason="wrong account")
    first = ToolCall.objects.get(run=run, name="lookup")
    replace_tool_result(first, by=None, result={"found": "other"}, note="repaired")
    resume_run(run)
    drive(run, client)
    assert run.state == "completed", refusals(api)
    assert statuses(api) == [200, 200, 200]
    sent = api.bodies[-1]["messages"]
    # Turn 0's block was written before the replaced result: it holds and goes back.
    assert kinds(sent[1]) == ["thinking", "tool_use"]
    # Turn 1's was written after the old result: the API would refuse it; left out, also
    # in the tool-use loop still open (the request the API's drop_block would send).
    assert kinds(sent[3]) == ["tool_use"]


def test_thinking__a_block_written_after_one_left_out_goes_back(api, client, agent):
    """The first run's block is left out once the conversation moves to another model. The
    second run's was written after that (on the new model), so it holds, and goes back in
    the third run's requests."""
    agent("talker", tools=[lookup])
    api.script = by_message(
        {
            "One.": [Reply([thought("First."), text("A.")])],
            "Two.": [Reply([thought("Second."), text("B.")])],
            "Three.": [Reply([thought("Third."), text("C.")])],
        }
    )
    conversation = start_conversation("talker")
    drive(send_message(conversation, "One."), client)
    for message in ("Two.", "Three."):
        run = send_message(conversation, message)
        Run.objects.filter(pk=run.pk).update(config={**run.config, "model": "claude-haiku-4-5"})
        drive(run, client)
    assert refusals(api) == []
    sent = api.bodies[-1]["messages"]
    assert [kinds(m) for m in sent if m["role"] == "assistant"] == [
        ["text"],
        ["thinking", "text"],
    ]


def test_thinking__a_fork_sends_the_blocks_it_copied_unchanged(api, client, agent):
    agent("thinker", tools=[lookup, delete_account])
    api.script = by_step(TWO_LOOKUPS)
    run = start_run("thinker", "Clean up.")
    drive(run, client)
    cancel_run(run)
    fork = fork_run(run, at_turn=1)
    drive(fork, client)
    assert fork.state == "awaiting_approval", refusals(api)
    assert statuses(api) == [200, 200, 200]
    assert kinds(api.bodies[-1]["messages"][1]) == ["thinking", "tool_use"]


def test_thinking__a_follow_up_on_another_model_leaves_the_blocks_out(api, client, agent):
    agent("talker", tools=[lookup])
    api.script = by_message(
        {
            "One.": [Reply([thought("Hm."), tool_use("lookup", {"query": "a"})]), text("A.")],
            "Two.": [Reply([thought("Again."), text("B.")])],
        }
    )
    conversation = start_conversation("talker")
    drive(send_message(conversation, "One."), client)
    second = send_message(conversation, "Two.")
    # The model changed between the runs (the blocks are tied to the model that wrote them).
    Run.objects.filter(pk=second.pk).update(config={**second.config, "model": "claude-haiku-4-5"})
    drive(second, client)
    assert second.state == "completed", refusals(api)
    assert statuses(api) == [200, 200, 200]
    assert kinds(api.bodies[-1]["messages"][1]) == ["tool_use"]


def test_thinking__after_a_rollback_the_blocks_before_it_go_back(api, client, agent):
    agent("talker", tools=[lookup])
    api.script = by_message(
        {
            "One.": [Reply([thought("Hm."), text("A.")])],
            "Two.": [Reply([thought("Two?"), text("B.")])],
            "Three.": [Reply([thought("Three."), text("C.")])],
        }
    )
    conversation = start_conversation("talker")
    drive(send_message(conversation, "One."), client)
    second = send_message(conversation, "Two.")  # still queued: rolled back by the next
    third = send_message(conversation, "Three.", policy="rollback")
    second.refresh_from_db()
    assert second.rolled_back
    drive(third, client)
    assert third.state == "completed", refusals(api)
    sent = api.bodies[-1]["messages"]
    assert kinds(sent[1]) == ["thinking", "text"]  # the first run's, unchanged before it
    assert all("Two." not in str(m["content"]) for m in sent)


# --------------------------------------------------------------------------- pause_turn

SEARCH_OPEN = server_tool_use("web_search", {"query": "otters"}, id="srvtoolu_01open")
PAUSED = Reply([text("Searching."), SEARCH_OPEN], stop_reason="pause_turn")


def _ended(how: str, run: Run, conversation: Any, settings: Any) -> None:
    if how == "cancel":
        cancel_run(run, reason="stop")
    elif how == "deadline":
        Run.objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    elif how == "interrupt":
        pass  # the follow-up's policy interrupts it


@pytest.mark.parametrize("how", ["cancel", "interrupt", "deadline", "final turn", "final notice"])
def test_pause_turn__a_run_ending_right_after_it_leaves_a_history_the_next_message_can_send(
    how, api, client, agent, settings
):
    settings.AGENTRUN_TURNS_PER_TASK = 1  # each advance one turn: the run may end in between
    max_turns = {"final turn": 1, "final notice": 2}.get(how, 6)
    agent(
        "searcher",
        tools=[lookup],
        server_tools=[server_tool("web_search_20250305", max_uses=3)],
        max_turns=max_turns,
    )
    api.script = by_message(
        {
            "Search.": [PAUSED, Reply([text("Gave up.")])],
            "And?": [Reply([text("Otters.")])],
        }
    )
    conversation = start_conversation("searcher")
    first = send_message(conversation, "Search.")
    drive(first, client, limit=1)  # the paused turn, and no more
    _ended(how, first, conversation, settings)
    if how in ("deadline", "final notice"):
        drive(first, client)
    policy = "interrupt" if how == "interrupt" else None
    second = send_message(conversation, "And?", policy=policy)
    first.refresh_from_db()
    assert first.state in ("completed", "cancelled", "timed_out"), first.state
    drive(second, client)
    assert second.state == "completed", refusals(api)
    assert refusals(api) == []
    sent = api.bodies[-1]["messages"]
    assert "srvtoolu_01open" not in str(sent)  # the unanswered use left out
    assert kinds(sent[1])[0] == "text"


# --------------------------------------------------------------------------- prefill


# A structured output the tests below resume after it failed.
COUNT = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.mark.no_projection_check  # the answer's row is rewritten below, not its events
def test_structured_output__resume_sends_no_prefill(api, client, agent):
    """Resumed after invalid_structured_output, the run's last answer would be the last
    message: a prefill, which the 5.5 generation refuses. (An answer cut off at max_tokens
    is continued after a user message already; a complete one that broke its schema is
    rare under the API's constrained decoding, and the stand-in will not script one, so the
    row is written as such.) A user message asks again."""
    agent("counter", model="claude-sonnet-5-5", thinking="adaptive", output_format=COUNT)
    api.script = by_step([Reply('{"n": 1', stop_reason="max_tokens"), Reply('{"n": 3}')])
    run = start_run("counter", "Count.")
    drive(run, client)
    assert (run.state, run.error_code) == ("failed", "invalid_structured_output")
    run.turns.update(stop_reason="end_turn", content=[text('{"n": 1')])
    resume_run(run)
    drive(run, client)
    assert run.state == "completed", refusals(api)
    assert api.bodies[-1]["messages"][-1] == {"role": "user", "content": RESUME_NOTICE}
    assert run.parsed_output == {"n": 3}


@pytest.mark.no_projection_check  # the answer's row is rewritten below, not its events
def test_structured_output__the_resume_notice_stays_in_the_history(api, client, agent):
    """After the resume notice the model calls a tool: the notice stays between the answer
    that could not be used and that turn in every later request (it was sent only once, so
    the resumed turn's thinking, written after it, was dropped from its own tool-use loop
    and two assistant messages sat back to back)."""
    agent(
        "counter2",
        model="claude-sonnet-5-5",
        tools=[lookup],
        thinking="adaptive",
        output_format=COUNT,
    )
    api.script = by_step(
        [
            Reply('{"n": 1', stop_reason="max_tokens"),
            Reply([thought("Check first."), tool_use("lookup", {"query": "n"})]),
            Reply('{"n": 3}'),
        ]
    )
    run = start_run("counter2", "Count.")
    drive(run, client)
    assert (run.state, run.error_code) == ("failed", "invalid_structured_output")
    run.turns.update(stop_reason="end_turn", content=[text('{"n": 1')])
    resume_run(run)
    drive(run, client)
    assert run.state == "completed", refusals(api)
    sent = api.bodies[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[2] == {"role": "user", "content": RESUME_NOTICE}
    assert kinds(sent[3]) == ["thinking", "tool_use"]  # written after the notice: it holds


# --------------------------------------------------------------------------- fork points


def test_fork_points__after_an_answer_cut_off_at_max_tokens(api, client, agent):
    agent("long", continue_on_max_tokens=True)
    api.script = by_step([Reply([text("The first half")], stop_reason="max_tokens"), "and more."])
    run = start_run("long", "Write.")
    drive(run, client)
    assert run.state == "completed"
    points = fork_points(run)
    assert [p.allowed for p in points] == [True, True, False]
    fork = fork_run(run, at_turn=1)
    drive(fork, client)
    assert fork.state == "completed", refusals(api)
    with pytest.raises(Exception, match=r"fork from turn 0 to 1\."):
        fork_run(run, at_turn=5)


# --------------------------------------------------------------------------- a repair meanwhile


def test_follow_up__sees_a_result_replaced_in_an_earlier_run_at_its_next_turn(api, client):
    """Issue #25: the task of a follow-up read the earlier runs once; a repair made while it
    runs (replace_tool_result) reaches its next request, not 50 turns or 30 s later."""
    from tests.testapp.agents import DURING

    api.script = by_message(
        {
            "One.": [Reply([tool_use("delete_account", {"user": "u"})])],
            "Two.": [Reply([tool_use("during", {"name": "repair"})]), text("Done.")],
        }
    )
    conversation = start_conversation("chat")
    first = send_message(conversation, "One.")
    drive(first, client)
    cancel_run(first, reason="not now")
    call = ToolCall.objects.get(run=first)
    DURING["repair"] = lambda: replace_tool_result(call, by=None, result="repaired meanwhile")
    try:
        second = send_message(conversation, "Two.")
        drive(second, client)
    finally:
        DURING.pop("repair", None)
    assert second.state == "completed", refusals(api)
    assert "repaired meanwhile" in str(api.bodies[-1]["messages"][2])
