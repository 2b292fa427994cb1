"""The example chat page (/chat/) as a person uses it, in headless Chromium against
uvicorn with real Celery workers and the Messages API stand-in streaming slowly: start a
conversation and watch the answer being written, approve a refund with its arguments
shown, interrupt a run with a follow-up, reload while the model writes, stop. From the
DOM: every durable event once and in order, each answered turn's text equal to its
committed text."""

from __future__ import annotations

import threading
import time

import pytest

from django_agentrun.models import Conversation, Run, RunEvent
from django_agentrun.testing.messages_api import Reply, text, tool_use
from tests import factories
from tests.browser.conftest import HEIGHT, WIDTH
from tests.factories import by_message
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ASK = "Where is my order?"
REFUND = "Please refund order A-1001."
INSTEAD = "Never mind, tell me about sea otters instead."
MORE = "And river otters?"

ANSWER = "Order A-1001 is held at the ParcelCo hub; it arrives on Friday. " * 6
AFTER_REFUND = "The refund is on its way. Meanwhile, a word about otters: " + "Otters " * 60
OTTERS = "Sea otters hold hands while they sleep, so that they do not drift apart. " * 5
RIVER = "River otters slide down muddy banks for fun, again and again. " * 12


def slow(*blocks, hold: threading.Event | None = None) -> Reply:
    """A reply the stand-in streams slowly: 8 characters a delta, 25 ms apart. With `hold`,
    the stream stops after its 12th event (10 deltas: 80 characters) until `hold` is set
    or the worker hangs up: the model is still writing for as long as the test looks."""
    return Reply(list(blocks), chunk_size=8, delay=0.025, hold=hold)


@pytest.fixture
def demo_dir(tmp_path, monkeypatch):
    """The demo's payment records in this test's folder (the workers inherit it)."""
    monkeypatch.setenv("AGENTRUN_DEMO_DIR", str(tmp_path / "demo"))


def live_text(page, position: int) -> str:
    return "".join(page.locator(f'.run[data-position="{position}"] .text.live').all_inner_texts())


def test_chat__start_stream_approve_interrupt_reload_stop(
    demo_dir, browser, messages_api, asgi_server, screenshots, figures
):
    started = time.monotonic()
    factories.user("alice", "approve_toolcall")
    # Each answer that the test watches being written waits, mid-stream, for the test: for
    # it to be released (the first, the third), or for the worker to hang up (the second
    # is interrupted, the fourth stopped). No step depends on how fast the machine is.
    first_written, third_written = threading.Event(), threading.Event()
    messages_api.script = by_message(
        {
            ASK: [slow(text(ANSWER), hold=first_written)],
            REFUND: [
                slow(
                    text("I'll refund it once approved."),
                    tool_use("issue_refund", {"order_id": "A-1001", "amount_cents": 4999}),
                ),
                slow(text(AFTER_REFUND), hold=threading.Event()),
            ],
            INSTEAD: [slow(text(OTTERS), hold=third_written)],
            MORE: [slow(text(RIVER), hold=threading.Event())],
        }
    )
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def shot(name: str) -> None:
        # The window as the person sees it (the composer stays at its bottom).
        page.screenshot(path=str(screenshots / f"chat-{name}.png"))

    def say(words: str) -> None:
        page.fill("#input", words)
        page.click("#send")

    # Log in (the page asks for it), start a conversation.
    page.goto(asgi_server.url + "/chat/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw")
    page.click("#login")
    page.wait_for_selector("#composer")
    say(ASK)

    # The words appear while the model writes, before its run completes.
    wait_for(lambda: len(live_text(page, 0)) > 20, interval=0.05, message="streamed words")
    conversation = Conversation.objects.get(owner__username="alice")
    first = Run.objects.get(conversation=conversation, conversation_position=0)
    first.refresh_from_db()
    assert first.state != "completed", "the run completed before any word was shown"
    shot("streaming")
    first_written.set()
    page.wait_for_selector('.run[data-position="0"] .text.committed')

    # A refund: the call waits for an approval, its arguments shown.
    say(REFUND)
    card = page.wait_for_selector('.call[data-state="awaiting_approval"]')
    assert '"order_id": "A-1001"' in card.inner_text() and "issue_refund" in card.inner_text()
    assert page.inner_text("#status") == "waiting for your approval"
    shot("approval")
    page.click(".call .approve")
    page.wait_for_selector('.call[data-state="succeeded"]')

    # While the answer after the refund is being written: a follow-up that interrupts it.
    wait_for(lambda: len(live_text(page, 1)) > 20, message="the second run's words")
    assert page.input_value("#policy") == "interrupt"
    say(INSTEAD)
    page.wait_for_selector('.run[data-position="1"][data-state="cancelled"]')
    assert "interrupted" in page.inner_text('.run[data-position="1"] .note')

    # A reload while the model writes: the page continues from its cursor.
    wait_for(lambda: len(live_text(page, 2)) > 20, message="the third run's words")
    shot("before-reload")
    page.reload()
    # The turn being written has its deltas sent again from the start.
    wait_for(lambda: len(live_text(page, 2)) > 20, message="the third run's words, reloaded")
    third_written.set()
    page.wait_for_selector('.run[data-position="2"] .text.committed')
    assert page.locator(".run").count() == 3

    # A stop while the model writes.
    say(MORE)
    wait_for(lambda: len(live_text(page, 3)) > 20, message="the fourth run's words")
    page.click("#stop")
    page.wait_for_selector('.run[data-position="3"][data-state="cancelled"]')
    wait_for(lambda: page.inner_text("#status") == "cancelled", message="the stopped status")
    shot("stopped")

    # From the DOM: each durable event once, in order; each answer as it was committed.
    runs = list(Run.objects.filter(conversation=conversation).order_by("conversation_position"))
    assert [r.state for r in runs] == ["completed", "cancelled", "completed", "cancelled"]
    stored = [
        f"{run.conversation_position}-{seq}"
        for run in runs
        for seq in RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)
    ]
    cursors = wait_for(
        lambda: (
            (found := page.eval_on_selector_all("#events li", "l => l.map(e => e.dataset.cursor)"))
            and len(found) >= len(stored)
            and found
        ),
        message="every event",
    )
    assert cursors == stored
    said = {ASK: ANSWER, REFUND: AFTER_REFUND, INSTEAD: OTTERS, MORE: RIVER}
    for run in runs:
        for turn in run.turns.order_by("index"):
            shown = "".join(
                page.locator(
                    f'.turn[data-position="{run.conversation_position}"][data-turn="{turn.index}"] .text'
                ).all_inner_texts()
            )
            committed = "".join(b["text"] for b in turn.content or [] if b["type"] == "text")
            if turn.content:
                assert shown == committed, (run.conversation_position, turn.index)
            else:  # cut short: what was shown of it, without gaps or repeats
                assert said[run.input].startswith(shown), (run.conversation_position, turn.index)
    assert errors == []
    context.close()
    figures(
        f"[browser] the chat page: 4 runs, {len(stored)} events, {time.monotonic() - started:.1f} s"
    )
