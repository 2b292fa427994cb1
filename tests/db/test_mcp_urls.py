"""An MCP server's URL: what a client is told when it cannot be reached (503, no exception
text), where its query string (an API key) never goes (httpx2's INFO lines, the log, the
answer), and the outbound policy where the host opts in (`public_only`)."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from django_agentrun import Agent
from django_agentrun.agents import unregister_agent
from django_agentrun.mcp import MCPServer, connections
from django_agentrun.models import Run

pytest.importorskip("mcp")
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

SECRET = "sekrit-key-123"


class NotMCP(BaseHTTPRequestHandler):
    """Answers every request 404: the client sends it (httpx2 logs it) and gives up."""

    hits: list[str] = []

    def do_POST(self):  # noqa: N802 - the stdlib's name
        NotMCP.hits.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    NotMCP.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NotMCP)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    connections.close_all()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/mcp?key={SECRET}"
    connections.close_all()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def define():
    names: list[str] = []

    def make(url: str, **options) -> Agent:
        name = f"mcp-url-{len(names)}"
        names.append(name)
        server = MCPServer.http("remote", url, connect_timeout=5, timeout=5, **options)
        return Agent(name=name, model="claude-sonnet-4-5", mcp_servers=[server])

    yield make
    for name in names:
        unregister_agent(name)


def start(agent: Agent):
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get_or_create(username="ann")[0])
    return client.post("/api/agentrun/runs/", {"agent": agent.name, "input": "Hi"}, format="json")


def test_unreachable__503_names_the_server_and_nothing_else(server, define, caplog):
    caplog.set_level(logging.INFO)
    response = start(define(server))
    assert response.status_code == 503, response.content
    assert response.json() == {
        "code": "mcp_unavailable",
        "detail": "MCP server remote could not be reached to list its tools: nothing was "
        "started; try again later.",
    }
    assert not Run.objects.exists()
    assert NotMCP.hits, "the request reached the server"
    # The detail is in the log, without the URL's query string; httpx2's INFO line too.
    assert SECRET not in caplog.text
    assert "cannot list its tools" in caplog.text
    assert any(r.name == "httpx2" and "[hidden]" in r.getMessage() for r in caplog.records)


def test_public_only__a_loopback_server_is_refused_unless_allowed(server, define, caplog):
    caplog.set_level(logging.INFO)
    refused = start(define(server, public_only=True))
    assert refused.status_code == 503 and not NotMCP.hits  # never connected
    assert "not a public address" in caplog.text and SECRET not in caplog.text
    start(define(server, public_only=True, allowed_hosts=["127.0.0.0/8"]))
    assert NotMCP.hits  # allowed: connected (and pinned to the checked address)
