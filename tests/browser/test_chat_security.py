"""The example chat page's security (issue #25), in headless Chromium against the live
server: a crafted `?c=` cannot turn the page's next POST into another request (it once
cancelled one of the victim's runs: client-side path traversal into a CSRF-carrying POST),
and the page works under its Content-Security-Policy (no inline script)."""

from __future__ import annotations

import re
import time

import pytest

from django_agentrun import start_run
from tests import factories
from tests.browser.conftest import HEIGHT, WIDTH

pytestmark = pytest.mark.django_db(transaction=True)


def test_chat__a_crafted_conversation_id_reaches_no_other_endpoint(
    browser, live_server, postgres, no_broker, settings
):
    # The page's stream (under this WSGI server) notices soon that the page went away.
    settings.AGENTRUN_STREAM_WSGI_MAX_SECONDS = 2
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.2
    alice = factories.user("alice")
    run = start_run("support-agent", "Refund order A-1001.", owner=alice)
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if "Security Policy" in m.text else None)
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    page.goto(live_server.url + "/accounts/login/?next=/chat/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw")
    page.click("#login")
    page.wait_for_selector("#composer")

    crafted = f"../runs/{run.pk}/cancel/?x="
    response = page.goto(live_server.url + "/chat/?c=" + crafted.replace("?", "%3F"))
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.wait_for_selector("#composer")
    assert "?c=" not in page.url  # the crafted id was dropped, not used
    page.fill("#input", "Where is my order?")
    page.click("#send")
    # A new conversation started, its id in the URL (Playwright's own wait: it pumps events).
    page.wait_for_url(re.compile(r"/chat/\?c=[0-9a-f-]{36}$"))
    page.wait_for_selector('.run[data-position="0"]')  # the message was sent, its run shown
    run.refresh_from_db()
    assert (run.state, run.cancel_requested_at) == ("queued", None)
    api = live_server.url + "/api/agentrun/"
    assert [p.removeprefix(api).split("/")[0] for p in posts if p.startswith(api)] == [
        "conversations",
        "conversations",
    ], posts
    assert all("/runs/" not in p for p in posts), posts
    assert errors == []
    context.close()
    time.sleep(0.5)
