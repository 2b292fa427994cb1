"""The Messages API's own MCP connector (servertools.MCPConnector): a server tool whose
`mcp_tool_use` / `mcp_tool_result` blocks are recorded as returned and sent back unchanged,
never executed here; through the engine, the real `anthropic` SDK and the stand-in (which
checks the connector's request rules: mcp_servers, mcp_toolset, the beta header, and plays
its tool listing: the answer's `mcp_tool_listing` block, which later requests reuse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from django_agentrun import Agent, send_message, start_conversation, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.servertools import MCPConnector, server_tool_uses
from django_agentrun.testing.messages_api import (
    APIRequestError,
    MessagesAPIServer,
    Reply,
    by_step,
    mcp_tool,
    text,
    tool_use,
    validate_request,
)
from tests.conftest import drive
from tests.testapp.agents import lookup

pytestmark = [pytest.mark.timeout(60), pytest.mark.one_driver, pytest.mark.django_db]


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
def docs_agent() -> Iterator[Agent]:
    agent = Agent(
        "mcp-connector",
        model="claude-sonnet-4-6",
        tools=[lookup],
        server_tools=[
            MCPConnector(
                "docs",
                "https://docs.example.com/mcp",
                authorization_token=lambda owner: f"token-of-{owner.username}",
            )
        ],
    )
    yield agent
    unregister_agent(agent.name)


def test_connector__blocks_recorded_and_sent_back__never_executed(api, client, docs_agent):
    api.script = by_step(
        [
            Reply(
                [
                    text("Searching the docs."),
                    *mcp_tool("docs", "search", {"q": "refunds"}, "Refunds take 5 days."),
                    tool_use("lookup", {"query": "order"}, id="toolu_look"),
                ]
            ),
            Reply([text("Refunds take 5 days.")]),
        ]
    )
    ann = get_user_model().objects.create_user("ann", password="x")
    run = start_run(docs_agent, "How long do refunds take?", owner=ann)
    # The snapshot keeps the server, not the token.
    assert run.config["options"]["mcp_servers"] == [
        {"type": "url", "url": "https://docs.example.com/mcp", "name": "docs"}
    ]
    assert "token-of" not in str(run.config)
    drive(run, client)
    assert run.state == "completed", (run.error_code, run.error_message, api.script_errors)
    assert not api.script_errors
    # Only the local tool_use became a call of this app's.
    assert [c.name for c in run.tool_calls.all()] == ["lookup"]
    first, second = api.requests[0], api.requests[1]
    assert "mcp-client-2025-11-20" in first["headers"]["anthropic-beta"]
    body = second["body"]
    assert body["mcp_servers"][0]["authorization_token"] == "token-of-ann"
    toolsets = [t for t in body["tools"] if t.get("type") == "mcp_toolset"]
    assert [t["mcp_server_name"] for t in toolsets] == ["docs"]
    sent = body["messages"][1]["content"]
    returned = run.turns.get(index=0).content
    assert [b["type"] for b in sent] == ["text", "mcp_tool_use", "mcp_tool_result", "tool_use"]
    assert sent[1:3] == returned[1:3]
    # Counted with the server tools' uses (the API's responses list them).
    uses = server_tool_uses(returned)
    assert [(u["name"], u["server_name"], u["result_type"]) for u in uses] == [
        ("search", "docs", "mcp_tool_result")
    ]


def listed(*names: str) -> list[dict]:
    return [
        {"name": n, "description": f"{n} the docs", "input_schema": {"type": "object"}}
        for n in names
    ]


def test_connector__its_tool_list_kept_with_the_conversation(api, client, docs_agent, admin_client):
    api.mcp_listings = {"docs": listed("search", "fetch")}
    api.script = by_step(
        [Reply(list(mcp_tool("docs", "search", {"q": "x"}, "found")) + [text("X.")])]
    )
    conversation = start_conversation(docs_agent, owner=get_user_model().objects.create_user("a"))
    first = send_message(conversation, "Find x.")
    drive(first, client)
    assert first.state == "completed", (first.error_code, api.script_errors)
    # The API listed the server's tools while answering: kept with the turn.
    content = first.turns.get(index=0).content
    assert content[0] == {
        "type": "mcp_tool_listing",
        "mcp_server_name": "docs",
        "tools": listed("search", "fetch"),
    }
    page = admin_client.get(reverse("admin:agentrun_run_change", args=[first.pk])).text
    assert "tools of docs, as the API listed them: search, fetch" in page
    # The server changes. The conversation goes on with the listing it was given: the
    # block is sent back, so the API does not ask the server again (and the model is not
    # offered `delete`); a new conversation sees the server as it is now.
    api.mcp_listings = {"docs": listed("search", "fetch", "delete")}
    api.script = lambda body: Reply(list(mcp_tool("docs", "delete", {"id": 1}, "gone")))
    second = send_message(conversation, "Delete it.")
    drive(second, client)
    sent = api.requests[-1]["body"]["messages"][1]["content"]
    assert sent[0]["type"] == "mcp_tool_listing" and len(sent[0]["tools"]) == 2
    assert second.state == "failed"
    assert "not in the listing the request uses (search, fetch)" in str(api.script_errors[-1])
    api.script = by_step(
        [Reply(list(mcp_tool("docs", "delete", {"id": 1}, "gone")) + [text("Deleted.")])]
    )
    fresh = start_run(docs_agent, "Delete it.", owner=get_user_model().objects.create_user("b"))
    drive(fresh, client)
    assert fresh.state == "completed", (fresh.error_code, api.script_errors)
    assert [t["name"] for t in fresh.turns.get(index=0).content[0]["tools"]] == [
        "search",
        "fetch",
        "delete",
    ]


def test_stand_in__the_model_calls_only_what_the_toolset_offers():
    from django_agentrun.testing.messages_api.mcp_connector import UnofferedMCPTool, answered

    toolset = {"type": "mcp_toolset", "mcp_server_name": "docs"}
    body = {"tools": [toolset], "messages": [{"role": "user", "content": "hi"}]}
    use = Reply(list(mcp_tool("docs", "fetch", {}, "ok")))
    # The toolset's own configuration (the connector page's allowlist).
    allow = {
        **toolset,
        "default_config": {"enabled": False},
        "configs": {"search": {"enabled": True}},
    }
    with pytest.raises(UnofferedMCPTool, match="disables"):
        answered({**body, "tools": [allow]}, use, None)
    # A pinned listing (the toolset's `tools`) is used as given: nothing is fetched.
    pinned = {**toolset, "tools": listed("fetch")}
    got = answered({**body, "tools": [pinned]}, use, {"docs": listed("search")})
    assert [b["type"] for b in got.blocks()] == ["mcp_tool_use", "mcp_tool_result"]


def test_stand_in__refuses_what_the_api_refuses():
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "mcp_servers": [{"type": "url", "url": "https://x.example/mcp", "name": "x"}],
        "tools": [{"type": "mcp_toolset", "mcp_server_name": "x"}],
    }
    validate_request(body, {"mcp-client-2025-11-20"})
    with pytest.raises(APIRequestError, match="anthropic-beta"):
        validate_request(body, set())
    with pytest.raises(APIRequestError, match="exactly one mcp_toolset"):
        validate_request({**body, "tools": []}, {"mcp-client-2025-11-20"})
    with pytest.raises(APIRequestError, match="https"):
        validate_request(
            {**body, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
            {"mcp-client-2025-11-20"},
        )
    with pytest.raises(ConfigurationError):
        MCPConnector("x", "http://insecure.example/mcp")
