"""Errors by what they mean (issue #36): a 429 the API says not to retry (the tier's spend
cap: `x-should-retry: false`, or `error.details.error_code` `enforced_spend_limit_reached`)
fails its run at once, within one request, with the API's message; a rate limit parks the
run for the wait the API states (`retry-after`, else the exhausted limit's reset), never
past the run's deadline, and a turn refused too often fails. Through the engine, the real
`anthropic` SDK and the Messages API stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from django_agentrun import start_run, wakeups
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine import Outcome, advance
from django_agentrun.events import EventType
from django_agentrun.models import RunEvent
from django_agentrun.testing.messages_api import (
    MessagesAPIServer,
    Reply,
    by_step,
    error,
    spend_cap,
    text,
)
from tests.conftest import assert_projection_matches, drive

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60), pytest.mark.one_driver]


@pytest.fixture
def api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer(api_key="test-key") as server:
        yield server


@pytest.fixture
def client(api: MessagesAPIServer) -> Iterator[AnthropicModelClient]:
    client = AnthropicModelClient(base_url=api.base_url, api_key="test-key", max_retries=0)
    yield client
    client.close()


@pytest.fixture
def woken(monkeypatch) -> list:
    """The countdowns of the wake-ups a parked run asked for (no broker here)."""
    sent: list = []
    monkeypatch.setattr(wakeups, "send", lambda run_id, countdown=None: sent.append(countdown))
    return sent


@pytest.mark.parametrize("said", ["x-should-retry", "error_code"])
def test_spend_cap__fails_its_run_within_one_request(said, api, client):
    api.script = lambda body: spend_cap(should_retry=False if said == "x-should-retry" else None)
    run = start_run("test-agent", "hello")
    drive(run, client, limit=5)
    assert run.state == "failed", run.state
    assert run.error_code == "usage_limit_reached" and run.failure_phase == "model"
    assert "You have reached your API usage limits" in run.error_message  # the API's words
    assert len(api.requests) == 1
    assert_projection_matches(run)


def test_rate_limit__a_turn_refused_too_often_fails(api, client, settings, woken):
    settings.AGENTRUN_MODEL_RATE_LIMIT_PARKS = 2
    api.script = lambda body: error(429, retry_after=0.01)
    run = start_run("test-agent", "hello")
    drive(run, client)
    assert run.state == "failed" and run.error_code == "rate_limited", run.state
    assert len(api.requests) == 3  # two parks, then the third refusal fails the turn
    parks = RunEvent.objects.filter(run=run, type=EventType.MODEL_RATE_LIMITED)
    assert [e.payload["parks"] for e in parks] == [1, 2]
    assert all(e.payload["status"] == 429 for e in parks)
    assert_projection_matches(run)


def _reset_in(seconds: int) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=seconds)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        ({"retry-after": "90"}, 90, 100),  # the API's wait, though longer than the backoff cap
        ({"reset in": 45}, 40, 55),  # no retry-after: the exhausted limit's reset
    ],
)
def test_rate_limit__the_wait_is_the_apis(
    headers, low, high, api, client, settings, woken, django_capture_on_commit_callbacks
):
    settings.AGENTRUN_MODEL_RETRY_MAX_SECONDS = 30
    if "reset in" in headers:  # made now: the reset is a time
        headers = {
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-limit": "1000",
            "anthropic-ratelimit-input-tokens-reset": _reset_in(headers["reset in"]),
        }
    api.script = by_step([error(429, headers=headers), Reply([text("ok")])])
    run = start_run("test-agent", "hello")
    with django_capture_on_commit_callbacks(execute=True):
        assert advance(run.pk, client=client) == Outcome.CONTINUED
    assert low <= woken[-1] <= high, woken


def test_rate_limit__never_parked_past_the_runs_deadline(
    api, client, woken, django_capture_on_commit_callbacks
):
    api.script = lambda body: error(429, retry_after=90)
    run = start_run("test-agent", "hello", deadline=timezone.now() + timedelta(seconds=10))
    with django_capture_on_commit_callbacks(execute=True):
        assert advance(run.pk, client=client) == Outcome.CONTINUED
    assert woken[-1] <= 11, woken
