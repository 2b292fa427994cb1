"""The example chat page's server side: it asks for a login (the project's login page, not
the admin's, so users who are not staff can use it), sets the CSRF cookie its POSTs need,
and tells the script where the API is and whether the user may decide; `agentrun_chat`
refuses clearly without Redis. (The page itself, in a browser: tests/browser/test_chat.py.)"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tests import factories

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]


def test_chat_page__asks_for_a_login_then_serves_the_page(client):
    response = client.get("/chat/")
    assert (response.status_code, response["Location"]) == (302, "/accounts/login/?next=/chat/")
    factories.user("alice")
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302
    response = client.get("/chat/")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies
    # Where the API is mounted, and the agent: JSON data for the script, not a script.
    assert config(response) == {
        "agent": "support-agent",
        "api": "/api/agentrun/",
        "mayDecide": False,
    }
    assert "demo/chat.js" in response.content.decode()


def config(response) -> dict:
    import json
    import re

    found = re.search(
        r'<script id="agentrun-chat-config" type="application/json">(.*?)</script>',
        response.content.decode(),
    )
    return json.loads(found.group(1))


def test_chat_page__tells_the_script_who_may_decide(client):
    client.force_login(factories.user("ann", "approve_toolcall"))
    assert config(client.get("/chat/"))["mayDecide"] is True


def test_chat_page__a_content_security_policy_and_no_inline_script(client):
    import re

    client.force_login(factories.user("alice"))
    response = client.get("/chat/")
    policy = dict(
        (part.split(" ", 1) + [""])[:2] for part in response["Content-Security-Policy"].split("; ")
    )
    assert policy["script-src"] == "'self'" and policy["default-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", response.content.decode(), re.S)
    # Every script is a file of this origin, or JSON data (which a browser never runs).
    assert all('src="' in attrs or 'type="application/json"' in attrs for attrs, _ in scripts)


def test_agentrun_chat__refuses_without_redis():
    with pytest.raises(CommandError, match="Redis does not answer at redis://127.0.0.1:1/0"):
        call_command("agentrun_chat", "--redis-url", "redis://127.0.0.1:1/0")


def test_demo_agent__has_a_tool_that_needs_approval():
    from django_agentrun.agents import get_agent

    assert get_agent("support-agent").tools["issue_refund"].requires_approval is True
