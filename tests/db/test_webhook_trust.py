"""Webhooks as a newcomer meets them (issue 37): a secret long enough to sign with, what the
admin shows escaped and in its one date format, a refused delivery retried on the schedule,
and `check` warning about a subscription a delivery will refuse."""

from __future__ import annotations

import base64
import re

import pytest
from django.core import checks

from django_agentrun import webhooks
from django_agentrun.admin.display import when
from django_agentrun.models import DeliveryStatus, WebhookDelivery, WebhookSubscription
from tests import factories
from tests.db.test_webhooks import deliveries, dispatched, hook  # noqa: F401 - fixtures
from tests.webhook_receiver import SECRET

pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

SHORT = "whsec_AA=="  # one byte


def secret_of(size: int) -> str:
    return "whsec_" + base64.b64encode(b"k" * size).decode()


def test_secret__at_least_24_bytes_in_settings():
    entry = {"name": "ops", "url": "https://hooks.example.com/", "events": ["*"]}
    for secret, refused in ((SHORT, True), (secret_of(23), True), (secret_of(24), False)):
        found = webhooks.problems([{**entry, "secret": secret}])
        assert bool(found) is refused, (secret, found)
    assert "at least 24" in webhooks.problems([{**entry, "secret": SHORT}])[0]


def manager(client):
    client.force_login(factories.user("ops", "manage_webhooks", is_staff=True))
    return client


def test_secret__at_least_24_bytes_in_the_admin(client):
    form = {"name": "crm", "url": "https://crm.example/hook", "events": ["*"], "active": "on"}
    refused = manager(client).post(
        "/admin/agentrun/webhooksubscription/add/", {**form, "secret": SHORT}
    )
    assert refused.status_code == 200 and b"at least 24" in refused.content
    assert not WebhookSubscription.objects.exists()
    made = client.post("/admin/agentrun/webhooksubscription/add/", {**form, "secret": SECRET})
    assert made.status_code == 302


def test_admin__the_secrets_end_is_escaped(client):
    sub = WebhookSubscription.objects.create(
        name="crm", url="https://crm.example/", secret=SECRET + "<img", events=["*"]
    )
    page = manager(client).get(f"/admin/agentrun/webhooksubscription/{sub.pk}/change/")
    assert page.status_code == 200
    assert b"&lt;img" in page.content and b"<img" not in page.content


def test_admin__lists_in_the_one_date_format_and_counts_in_words(hook, dispatched, client):  # noqa: F811
    factories.completed_run()
    (row,) = deliveries()
    webhooks.deliver(row.pk)
    row.refresh_from_db()
    manager(client)
    listed = client.get("/admin/agentrun/webhookdelivery/").content.decode()
    assert when(row.created_at) in listed
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", listed)
    sub = WebhookSubscription.objects.create(name="x", url="https://x.example/", events=["*"])
    assert (
        when(sub.updated_at) in client.get("/admin/agentrun/webhooksubscription/").content.decode()
    )
    answer = client.post(
        "/admin/agentrun/webhookdelivery/",
        {"action": "resend", "_selected_action": [str(row.pk)]},
        follow=True,
    )
    assert "1 delivery will be sent again." in answer.content.decode()


def test_deliver__a_refused_url_is_retried_on_the_schedule(hook, dispatched, settings):  # noqa: F811
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = []
    factories.completed_run()
    (row,) = deliveries()
    assert webhooks.deliver(row.pk) == "retrying"
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING and "not a public address" in row.last_error
    assert hook.received == []
    # Allowed since: the next try goes through.
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    assert webhooks.deliver(row.pk) == "delivered"
    assert WebhookDelivery.objects.get(pk=row.pk).attempts == 2


def test_deliver__a_refused_url_fails_once_the_schedule_is_spent(hook, dispatched, settings):  # noqa: F811
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = []
    factories.completed_run()
    (row,) = deliveries()
    outcomes = [webhooks.deliver(row.pk) for _ in range(3)]  # a schedule of two retries
    assert outcomes == ["retrying", "retrying", "failed"]


@pytest.mark.parametrize(
    ("url", "allowed", "warned"),
    [
        ("http://127.0.0.1:8001/hook", [], True),
        ("http://localhost:8001/hook", [], True),
        ("http://[::ffff:10.0.0.1]/hook", [], True),
        ("http://[64:ff9b::a9fe:a9fe]/hook", [], True),
        ("http://127.0.0.1:8001/hook", ["127.0.0.1"], False),
        ("http://10.1.2.3/hook", ["10.0.0.0/8"], False),
        ("https://hooks.example.com/hook", [], False),  # names resolve only at delivery
        ("https://93.184.216.34/hook", [], False),
    ],
)
def test_check__a_static_subscription_a_delivery_will_refuse(settings, url, allowed, warned):
    settings.AGENTRUN_WEBHOOKS = [{"name": "ops", "url": url, "secret": SECRET, "events": ["*"]}]
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = allowed
    found = [m for m in checks.run_checks() if m.id == "agentrun.W050"]
    assert bool(found) is warned, found
    if warned:
        assert "AGENTRUN_WEBHOOK_ALLOWED_HOSTS" in found[0].hint
