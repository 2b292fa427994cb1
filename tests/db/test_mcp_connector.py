"""The Messages API's own MCP connector (servertools.MCPConnector): a server tool whose
`mcp_tool_use` / `mcp_tool_result` blocks are recorded as returned and sent back unchanged,
never executed here; through the engine, the real `anthropic` SDK and the stand-in (which
checks the connector's request rules: mcp_servers, mcp_toolset, the beta header, and that
the model calls only the tools the toolset enables). Its tool list is kept with the run:
listed from a real MCP server (tests/testapp/mcp_server.py over streamable HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model

from django_agentrun import Agent, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.mcp import connections
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
from django_agentrun.testing.processes import http_answers
from tests.conftest import drive
from tests.processes import ROOT, free_port, wait_for
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
    """A connector whose tool list the API reads at each request (snapshot=False)."""
    agent = Agent(
        "mcp-connector",
        model="claude-sonnet-4-6",
        tools=[lookup],
        server_tools=[
            MCPConnector(
                "docs",
                "https://docs.example.com/mcp",
                authorization_token=lambda owner: f"token-of-{owner.username}",
                snapshot=False,
            )
        ],
    )
    yield agent
    unregister_agent(agent.name)


@pytest.fixture
def shop_http(tmp_path, monkeypatch):
    """tests/testapp/mcp_server.py over streamable HTTP; restart(version) starts it again
    with that tool list (AGENTRUN_TEST_MCP_VERSION)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    monkeypatch.setenv("AGENTRUN_TEST_MCP_LOG", str(tmp_path / "mcp.jsonl"))
    procs: list[subprocess.Popen] = []

    def start(version: str = "1") -> None:
        if procs:
            procs[-1].kill()
            procs[-1].wait()
        connections.close_all()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTRUN_TEST_MCP_VERSION": version}
        argv = [sys.executable, "-m", "tests.testapp.mcp_server", "--http", str(port)]
        with open(tmp_path / f"mcp-{len(procs)}.log", "w") as log:
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log))
        wait_for(lambda: http_answers(url), timeout=30, message="the MCP HTTP server")

    start()
    yield url, start
    connections.close_all()
    for proc in procs:
        proc.kill()
        proc.wait()


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


def test_connector__tool_list_kept_with_the_run(api, client, shop_http, request):
    url, restart = shop_http
    agent = Agent(
        "mcp-connector-kept",
        model="claude-sonnet-4-6",
        server_tools=[
            MCPConnector(
                "shop",
                "https://shop.example.com/mcp",
                list_url=url,
                configs={"refund": {"enabled": False}},
            )
        ],
    )
    request.addfinalizer(lambda: unregister_agent(agent.name))
    run = start_run(agent, "How many hats?")
    # The server changes: a new tool (discount). The run keeps what it was offered.
    restart("2")
    later = start_run(agent, "How many hats?")
    toolset = next(t for t in run.config["tools"] if t.get("type") == "mcp_toolset")
    assert toolset["default_config"] == {"enabled": False}
    enabled = {name for name, c in toolset["configs"].items() if c["enabled"]}
    assert {"stock", "set_flag", "chart"} <= enabled
    assert "refund" not in enabled and "discount" not in enabled
    assert "discount" not in run.config["mcp_connector_tools"]["shop"]
    assert "discount" in later.config["mcp_connector_tools"]["shop"]
    # The stand-in (as the API) lets the model call only what the toolset enables.
    api.script = by_step(
        [
            Reply(list(mcp_tool("shop", "discount", {"order": "o1"}, "discounted"))),
            Reply([text("never")]),
        ]
    )
    drive(run, client)
    assert run.state == "failed"
    assert "disables" in str(api.script_errors[0])
    api.script = by_step(
        [Reply(list(mcp_tool("shop", "stock", {"item": "hat"}, "3"))), Reply([text("3 hats.")])]
    )
    drive(later, client)
    assert later.state == "completed", (later.error_code, api.script_errors)


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
