"""The example chat page's server side: it asks for a login (the project's login page, not
the admin's, so users who are not staff can use it), sets the CSRF cookie its POSTs need,
and tells the script where the API is and whether the user may decide; `agentrun_chat`
refuses clearly without Redis. (The page itself, in a browser: tests/browser/test_chat.py.)"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tests import factories

pytestmark = pytest.mark.django_db


def test_chat_page__asks_for_a_login_then_serves_the_page(client):
    response = client.get("/chat/")
    assert (response.status_code, response["Location"]) == (302, "/accounts/login/?next=/chat/")
    factories.user("alice")
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302
    response = client.get("/chat/")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies
    page = response.content.decode()
    # Where the API is mounted, and the agent (escapejs writes "-" as \u002D).
    assert 'api: "/api/agentrun/"' in page
    assert 'agent: "support\\u002Dagent"' in page
    assert "mayDecide: false" in page and "demo/chat.js" in page


def test_chat_page__tells_the_script_who_may_decide(client):
    client.force_login(factories.user("ann", "approve_toolcall"))
    assert "mayDecide: true" in client.get("/chat/").content.decode()


def test_agentrun_chat__refuses_without_redis():
    with pytest.raises(CommandError, match="Redis does not answer at redis://127.0.0.1:1/0"):
        call_command("agentrun_chat", "--redis-url", "redis://127.0.0.1:1/0")


def test_demo_agent__has_a_tool_that_needs_approval():
    from django_agentrun.agents import get_agent

    assert get_agent("support-agent").tools["issue_refund"].requires_approval is True
