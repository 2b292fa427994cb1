"""Webhooks through real workers: a worker killed after the commit that wrote a delivery
and before it sent it (failpoint webhook.before_send=crash); the delivery still arrives,
once per webhook id, verified with the library against its signature."""

from __future__ import annotations

import itertools
import json

import pytest

from django_agentrun import start_run, webhooks
from django_agentrun.models import DeliveryStatus, WebhookAttempt, WebhookDelivery
from django_agentrun.testing.messages_api import Reply, by_step, text
from tests.processes import wait_for, wait_resting
from tests.webhook_receiver import SECRET, receiver

pytestmark = pytest.mark.timeout(90)


def subscribe(settings, url: str, **more) -> dict[str, str]:
    """Subscribe `url` to every event, here and in the workers (their environment)."""
    hooks = {
        "WEBHOOKS": [{"name": "ops", "url": url, "secret": SECRET, "events": ["*"]}],
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        "WEBHOOK_TIMEOUT_SECONDS": 1.0,
        "WEBHOOK_LOST_AFTER_SECONDS": 1.0,
        **more,
    }
    for name, value in hooks.items():
        setattr(settings, f"AGENTRUN_{name}", value)
    return {"AGENTRUN_TEST_WEBHOOK_SETTINGS": json.dumps(hooks)}


def test_webhook__a_worker_killed_before_sending_still_delivers_once(
    workers, messages_api, settings
):
    messages_api.script = by_step([Reply([text("Done.")])])
    with receiver() as hook:
        env = subscribe(settings, hook.url)
        doomed = workers.start(failpoints="webhook.before_send=crash", **env)
        run = start_run("test-agent", "hello")
        wait_resting(run)
        assert run.state == "completed", (run.state, run.error_code, workers.logs())
        # The worker committed the run's end with its delivery, took the delivery and died.
        assert workers.wait_exit(doomed) == 137
        (delivery,) = WebhookDelivery.objects.filter(run_id=run.pk)
        assert delivery.status == DeliveryStatus.PENDING and delivery.locked_until is not None
        assert hook.received == []

        workers.start(**env)

        def recovered():
            webhooks.sweep()  # the reaper's pass: the delivery's task died with its worker
            delivery.refresh_from_db()
            return delivery.status == DeliveryStatus.DELIVERED

        wait_for(recovered, timeout=40, interval=0.5, message="the delivery sent after the crash")
        (got,) = hook.received
        assert got.headers["webhook-id"] == delivery.webhook_id
        body = got.verified()
        assert body["type"] == "run.completed" and body["data"]["run_id"] == str(run.pk)
        assert WebhookAttempt.objects.filter(delivery=delivery).count() == 1


def test_webhook__a_failing_receiver_is_retried_by_the_worker_with_backoff(
    workers, messages_api, settings
):
    messages_api.script = by_step([Reply([text("Done.")])])
    with receiver() as hook:
        hook.replies = [(500, b"down", {}), (502, b"still down", {}), (200, b"ok", {})]
        env = subscribe(settings, hook.url, WEBHOOK_RETRY_SECONDS=[1, 2], WEBHOOK_RETRY_JITTER=0)
        workers.start(**env)
        run = start_run("test-agent", "hello")
        wait_resting(run)
        (delivery,) = WebhookDelivery.objects.filter(run_id=run.pk)

        def delivered():
            delivery.refresh_from_db()
            return delivery.status == DeliveryStatus.DELIVERED

        wait_for(delivered, timeout=30, interval=0.2, message="delivered on the third try")
        assert hook.ids() == [delivery.webhook_id] * 3
        tries = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
        assert [t.status_code for t in tries] == [500, 502, 200]
        gaps = [(b.started_at - a.started_at).total_seconds() for a, b in itertools.pairwise(tries)]
        assert gaps[0] >= 1 and gaps[1] >= 2, gaps  # the schedule's waits, at least
        for got in hook.received:
            assert got.verified()["data"]["run_id"] == str(run.pk)
