"""Server tools, the cache that follows the conversation and context management, through
the engine, the real `anthropic` SDK and the Messages API stand-in (which validates every
request as the API does: server-tool pairing, breakpoints, compaction blocks, betas)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from django_agentrun import Agent, ClearToolUses, Compaction, server_tool, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.events import EventType
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.models import Run, RunEvent, ToolCall, Turn
from django_agentrun.testing.messages_api import (
    MessagesAPIServer,
    Reply,
    by_step,
    text,
    tool_use,
    web_search,
)
from tests.conftest import drive
from tests.testapp.agents import lookup, save_note

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.timeout(60), pytest.mark.one_driver]


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
    """Define a test's own agent (registered in this process), forgotten after."""
    names: list[str] = []

    def define(name: str, **options: Any) -> Agent:
        names.append(name)
        return Agent(name, model="claude-haiku-4-5", **options)

    yield define
    for name in names:
        unregister_agent(name)


SEARCH = web_search("sea otters", [("https://otters.example/sea", "Sea otters")])


@pytest.mark.django_db
def test_server_tool_blocks_are_recorded_sent_back_and_never_executed(api, client, test_log):
    first = Reply([*SEARCH, text("Let me note it."), tool_use("lookup", {"query": "otters"})])
    # The API paused its own loop with a search under way; the continuation answers it.
    more, found = web_search("otter habits", [("https://otters.example/h", "Habits")])
    paused = Reply([{**more, "id": "srvtoolu_01more"}], stop_reason="pause_turn")
    last = Reply([{**found, "tool_use_id": "srvtoolu_01more"}, text("Otters hold hands.")])
    api.script = by_step([first, paused, last])
    run = start_run("researcher", "What do otters do?")
    drive(run, client)

    assert run.state == "completed", [r["error"] for r in api.requests]
    assert run.output["text"] == "Otters hold hands."  # with the blocks that came with it
    # Only this app's own tool is a call of its own: no row, no approval for server tools.
    assert list(ToolCall.objects.filter(run=run).values_list("name", flat=True)) == ["lookup"]
    turns = list(Turn.objects.filter(run=run).order_by("index"))
    assert [t.stop_reason for t in turns] == ["tool_use", "pause_turn", "end_turn"]
    assert [b["type"] for b in turns[0].content] == [
        "server_tool_use",
        "web_search_tool_result",
        "text",
        "tool_use",
    ]
    # Sent back unchanged, each time, and the paused turn is continued: its content is the
    # last message of the next request, as the API requires.
    bodies = api.bodies
    assert bodies[1]["messages"][1]["content"] == turns[0].content
    assert bodies[2]["messages"][-1] == {"role": "assistant", "content": turns[1].content}
    assert bodies[0]["tools"][-1] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "max_uses": 3,
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
    }
    # Their usage is kept as returned (the cost prices it), on the turn and in its event.
    assert turns[0].usage_details["server_tool_use"] == {
        "web_search_requests": 1,
        "web_fetch_requests": 0,
    }
    assert set(turns[0].usage_details["cache_creation"]) == {
        "ephemeral_5m_input_tokens",
        "ephemeral_1h_input_tokens",
    }
    answer = RunEvent.objects.filter(run=run, type=EventType.MODEL_RESPONSE).first()
    assert answer.payload["usage"]["server_tool_use"]["web_search_requests"] == 1
    assert answer.payload["content"] == turns[0].content


@pytest.mark.django_db
def test_on_a_20_turn_run_full_price_input_falls_to_each_turns_new_content(api, client, test_log):
    """The cache follows the conversation: each turn reads what the turn before it wrote
    and writes only what is new; the tokens billed at full price stay the request's own
    overhead however long the history, while the prompt grows."""
    steps: list[Any] = [
        Reply([text(f"Step {n}."), tool_use("lookup", {"query": f"otter fact {n}"})])
        for n in range(19)
    ]
    api.script = by_step([*steps, Reply("All 19 facts found.")])
    run = start_run("researcher", "Collect 19 otter facts.")
    drive(run, client, limit=60)
    assert run.state == "completed"
    turns = list(Turn.objects.filter(run=run).order_by("index"))
    assert len(turns) == 20
    prompts = [
        t.input_tokens + t.cache_creation_input_tokens + t.cache_read_input_tokens for t in turns
    ]
    assert prompts[-1] > prompts[0] + 19 * 30  # the history grew every turn
    assert turns[0].cache_read_input_tokens == 0
    assert turns[0].cache_creation_input_tokens > 1024  # the long system prompt, written once
    for before, turn in zip(turns, turns[1:], strict=False):
        new = json.dumps(before.content) + json.dumps(
            [
                c.tool_result_block()
                for c in ToolCall.objects.filter(run=run, turn_index=before.index)
            ]
        )
        # Read: everything the turn before sent; written: only the new content.
        assert turn.cache_read_input_tokens == (
            before.cache_read_input_tokens + before.cache_creation_input_tokens
        ), turn.index
        assert 0 < turn.cache_creation_input_tokens <= len(new) // 4 + 10, turn.index
        # Full price: the request's own keys, never the history.
        assert turn.input_tokens < 10, turn.index
        assert turn.usage_details["cache_creation"]["ephemeral_1h_input_tokens"] == (
            turn.cache_creation_input_tokens
        )
    assert run.cache_read_input_tokens == sum(t.cache_read_input_tokens for t in turns)


@pytest.mark.django_db
def test_compaction_pauses_the_run_goes_on_and_the_block_is_sent_back(api, client, agent):
    agent(
        "compacting",
        system="You summarize long material. " * 100,
        tools=[lookup],
        context_management=Compaction(trigger_tokens=1500, pause_after=True),
    )
    api.script = by_step([Reply("never: compacted first"), Reply("Otters, in short.")])
    run = start_run("compacting", "otters " * 1000)
    drive(run, client)
    assert run.state == "completed" and run.output["text"] == "Otters, in short."
    turns = list(Turn.objects.filter(run=run).order_by("index"))
    assert [t.stop_reason for t in turns] == ["compaction", "end_turn"]
    assert [b["type"] for b in turns[0].content] == ["compaction"]
    first, second = api.requests
    for sent in (first, second):
        assert "compact-2026-01-12" in sent["headers"]["anthropic-beta"]
        assert sent["body"]["context_management"] == {
            "edits": [
                {
                    "type": "compact_20260112",
                    "trigger": {"type": "input_tokens", "value": 1500},
                    "pause_after_compaction": True,
                }
            ]
        }
    # Kept in the history as the API requires: the block comes back unchanged (the
    # stand-in checks its signature), and the conversation before it stays recorded.
    assert second["body"]["messages"][1] == {"role": "assistant", "content": turns[0].content}
    assert second["body"]["messages"][0]["content"] == "otters " * 1000


@pytest.mark.django_db
def test_context_editing_is_sent_with_its_beta(api, client, agent):
    agent(
        "editing",
        tools=[lookup],
        context_management=ClearToolUses(trigger_tokens=30000, keep=3, exclude_tools=("lookup",)),
    )
    api.script = by_step([Reply("Done.")])
    run = start_run("editing", "hi")
    drive(run, client)
    assert run.state == "completed"
    sent = api.last_request
    assert "context-management-2025-06-27" in sent["headers"]["anthropic-beta"]
    assert sent["body"]["context_management"] == {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 30000},
                "keep": {"type": "tool_uses", "value": 3},
                "exclude_tools": ["lookup"],
            }
        ]
    }


@pytest.mark.django_db
def test_deferred_tools_with_tool_search(api, client, agent):
    agent(
        "searching-tools",
        tools=[lookup, save_note],
        server_tools=[server_tool("tool_search_tool_regex_20251119")],
        defer_loading=["save_note"],
    )
    api.script = by_step([Reply("Done.")])
    run = start_run("searching-tools", "hi")
    drive(run, client)
    assert run.state == "completed"
    tools = {t["name"]: t for t in api.last_request["body"]["tools"]}
    assert tools["save_note"]["defer_loading"] is True
    assert "defer_loading" not in tools["lookup"]
    assert tools["tool_search_tool_regex"]["type"] == "tool_search_tool_regex_20251119"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"server_tools": [{"type": "web_search_2099", "name": "web_search"}]},
            "is not a server tool",
        ),
        (
            {"server_tools": [{"type": "web_search_20250305", "name": "search"}]},
            "must be named 'web_search'",
        ),
        (
            {
                "server_tools": [
                    {"type": "web_search_20250305", "name": "web_search", "max_hits": 2}
                ]
            },
            "takes no option max_hits",
        ),
        ({"defer_loading": ["lookup"]}, "needs a tool search server tool"),
        ({"defer_loading": ["nope"]}, "names tools it does not have"),
        ({"context_management": "compact"}, "must be Compaction(...) or ClearToolUses(...)"),
        (
            {"context_management": Compaction(trigger_tokens=0)},
            "trigger_tokens must be a positive int",
        ),
    ],
)
def test_agent_configuration_is_refused_clearly(options, message):
    with pytest.raises(ConfigurationError) as raised:
        Agent("bad", model="claude-haiku-4-5", tools=[lookup], register=False, **options)
    assert message in str(raised.value)


def test_server_tool_takes_the_sdks_types_names_and_options():
    assert server_tool("web_fetch_20250910", max_uses=2) == {
        "type": "web_fetch_20250910",
        "name": "web_fetch",
        "max_uses": 2,
    }
    assert server_tool("code_execution_20250825")["name"] == "code_execution"
    with pytest.raises(ConfigurationError, match="Unknown server tool type 'web_search'"):
        server_tool("web_search")


@pytest.mark.django_db
def test_the_api_and_the_admin_show_the_server_tools(api, client, test_log):
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse
    from rest_framework.test import APIClient

    api.script = by_step([Reply([*SEARCH, text("Otters hold hands.")])])
    root = User.objects.create_superuser("root", password="pw")
    run = start_run("researcher", "What do otters do?", owner=root)
    drive(run, client)
    rest = APIClient()
    rest.force_authenticate(root)
    turn = rest.get(reverse("agentrun:run-detail", args=[run.pk])).json()["turns"][0]
    assert turn["tool_calls"] == []
    assert turn["server_tools"] == [
        {
            "id": turn["content"][0]["id"],
            "name": "web_search",
            "input": {"query": "sea otters"},
            "result_type": "web_search_tool_result",
            "result": turn["content"][1]["content"],
        }
    ]
    assert turn["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 0}
    assert set(turn["usage"]["cache_creation"]) == {
        "ephemeral_5m_input_tokens",
        "ephemeral_1h_input_tokens",
    }
    browser = Client()
    browser.force_login(root)
    page = browser.get(reverse("admin:agentrun_run_change", args=[run.pk])).content.decode()
    assert "[web_search, run by the API:" in page
    assert "[web_search_tool_result: 1 result]" in page


@pytest.mark.django_db
def test_a_server_tool_the_model_refuses_fails_at_start_run_naming_both(agent):
    from django_agentrun.exceptions import InvalidOption

    agent("old-searcher", server_tools=[server_tool("web_search_20260209")])
    with pytest.raises(InvalidOption) as raised:
        start_run("old-searcher", "hi")
    assert "claude-haiku-4-5 does not accept the server tool web_search_20260209" in str(
        raised.value
    )
    assert not Run.objects.exists()
