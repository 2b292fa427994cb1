"""The browser tier: the admin in headless Chromium (Debian's `chromium`, driven by the
`playwright` package) against pytest-django's live server, on Postgres; the chat page
against uvicorn with real Celery workers (the worker tier's `asgi_server`).

One browser for the session; each test opens its own context (cookies) at 1,400 x 900 px,
the admin's nav sidebar open. Screenshots go to `artifacts/screenshots/` (printed in the
figures after the run). `AGENTRUN_CHROMIUM` names another Chromium binary.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
WIDTH, HEIGHT = 1400, 900
# Without the background-networking flags Chromium reaches for Google's services, which
# this machine's closed network refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    path = os.environ.get("AGENTRUN_CHROMIUM") or "/usr/bin/chromium"
    return path if os.path.exists(path) else shutil.which("chromium")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    path = chromium_path()
    if path is None:
        pytest.skip("needs Chromium (apt-get install chromium, or AGENTRUN_CHROMIUM=...)")
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop running in this thread while the browser
    # is open; the tests' (and fixtures') ORM calls are still plain synchronous ones.
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if before is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


_SHOWN = pytest.StashKey[bool]()


@pytest.fixture
def screenshots(request, figures) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    if not request.config.stash.get(_SHOWN, False):
        request.config.stash[_SHOWN] = True
        figures(f"[browser] screenshots in {SCREENSHOTS}")
    return SCREENSHOTS


@pytest.fixture
def console(browser, live_server, postgres, no_broker, screenshots):
    """Open the admin as a person: `console.login(user)` (through the login form), then
    `console.page` (a Playwright page), `console.go(path)`, `console.shot(name)`."""
    contexts = []

    class Console:
        url = live_server.url
        page = None

        def login(self, username: str, password: str = "pw"):
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
            contexts.append(context)
            self.page = context.new_page()
            self.page.set_default_timeout(15_000)
            self.go("/admin/login/?next=/admin/")
            self.page.fill("#id_username", username)
            self.page.fill("#id_password", password)
            self.page.click("input[type=submit]")
            self.page.wait_for_selector("#site-name")
            assert "/admin/login/" not in self.page.url, f"{username} could not log in"
            return self.page

        def go(self, path: str):
            response = self.page.goto(self.url + path)
            assert response is not None and response.status < 500, (
                path,
                response and response.status,
            )
            return response

        def shot(self, name: str) -> Path:
            path = screenshots / f"{name}.png"
            self.page.screenshot(path=str(path), full_page=True)
            return path

        def messages(self) -> list[str]:
            """The messages of the page a click led to."""
            self.page.wait_for_load_state()
            self.page.wait_for_selector("ul.messagelist li")
            return [m.strip() for m in self.page.locator("ul.messagelist li").all_inner_texts()]

    yield Console()
    for context in contexts:
        context.close()


# The chat page's test needs what the worker tier's stream tests use: real Celery workers
# and uvicorn serving the example project on the live streams' Redis.
from tests.workers.conftest import asgi_server, workers  # noqa: E402, F401
