"""The Messages API's own MCP connector (servertools.MCPConnector): a server tool whose
`mcp_tool_use` / `mcp_tool_result` blocks are recorded as returned and sent back unchanged,
never executed here; through the engine, the real `anthropic` SDK and the stand-in (which
checks the connector's request rules: mcp_servers, mcp_toolset, the beta header)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model

from django_agentrun import Agent, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.servertools import MCPConnector
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
