"""Webhooks from the outbox: a delivery is written in the commit of the change it reports
(and only then), sent signed to a real HTTP server, retried on the schedule with each try
recorded, refused for private addresses, resent from the admin; e-mail to the approvers."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.core import checks, mail
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_agentrun import (
    cancel_run,
    send_message,
    start_conversation,
    start_run,
    tasks,
    transitions,
    webhooks,
)
from django_agentrun.admin.display import when
from django_agentrun.exceptions import ConcurrentUpdate
from django_agentrun.models import (
    DeliveryStatus,
    Run,
    WebhookAttempt,
    WebhookDelivery,
    WebhookSubscription,
)
from django_agentrun.reaper import reap
from django_agentrun.states import RunState
from django_agentrun.store import Write, send
from django_agentrun.testing import ScriptedClient, reply, text
from tests import factories
from tests.conftest import drive
from tests.webhook_receiver import SECRET, receiver


@pytest.fixture(autouse=True)
def _fresh_subscriptions():
    webhooks.forget_subscriptions()
    yield
    webhooks.forget_subscriptions()


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """The deliveries handed to a worker (ids), instead of publishing them."""
    sent: list[str] = []
    lock = threading.Lock()

    def record(*args, **kwargs):
        with lock:
            sent.append(str(kwargs["args"][0]))

    monkeypatch.setattr(tasks.deliver_webhook, "apply_async", record)
    return sent


@pytest.fixture
def hook(settings):
    """A receiver subscribed (in settings) to every event, loopback allowed."""
    with receiver() as rec:
        settings.AGENTRUN_WEBHOOKS = [
            {"name": "ops", "url": rec.url, "secret": SECRET, "events": ["*"]}
        ]
        settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
        settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = [0, 0]
        settings.AGENTRUN_WEBHOOK_RETRY_JITTER = 0.0
        yield rec


def deliveries(**filters) -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.filter(**filters).order_by("created_at"))


@pytest.mark.django_db
def test_outbox__a_completed_run_writes_its_delivery_and_hands_it_over_after_commit(
    hook, dispatched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run = factories.completed_run()
    (row,) = deliveries(event_type="run.completed")
    assert row.run_id == run.pk and row.subscription == "ops" and row.url == hook.url
    assert row.payload["type"] == "run.completed"
    assert row.payload["data"]["run_id"] == str(run.pk)
    assert row.payload["data"]["run_state"] == "completed"
    assert row.payload["data"]["stop_reason"] == "end_turn"
    assert str(row.pk) in dispatched


@pytest.mark.django_db
def test_outbox__an_approval_names_the_tool_and_its_decision_page_never_its_arguments(
    hook, dispatched, settings
):
    settings.AGENTRUN_WEBHOOK_ADMIN_URL = "https://ops.example.com/"
    run, call, _ = factories.parked()
    (row,) = deliveries(event_type="tool_call.awaiting_approval")
    data = row.payload["data"]
    assert data["tool_call_id"] == call.tool_call_id and data["tool_name"] == "delete_account"
    assert (
        data["decision_url"] == f"https://ops.example.com/admin/agentrun/toolcall/{call.pk}/change/"
    )
    assert "bob" not in json.dumps(row.payload)


@pytest.mark.django_db
def test_outbox__a_conversation_run_also_reports_conversation_run_finished(hook, dispatched):
    conversation = start_conversation("test-agent")
    run = send_message(conversation, "hello")
    drive(run, ScriptedClient([reply(text("Hi."))]))
    rows = deliveries(run_id=run.pk)
    assert [d.event_type for d in rows] == ["run.completed", "conversation.run_finished"]
    assert rows[1].payload["data"]["conversation_id"] == str(conversation.pk)


@pytest.mark.django_db
def test_outbox__the_reaper_s_time_out_writes_its_delivery(hook, dispatched):
    run = start_run("test-agent", "go", deadline=timezone.now() - timedelta(seconds=1))
    reap()
    run.refresh_from_db()
    assert run.state == RunState.TIMED_OUT
    (row,) = deliveries(run_id=run.pk)
    assert (row.event_type, row.payload["data"]["run_state"]) == ("run.timed_out", "timed_out")


@pytest.mark.django_db
def test_outbox__an_unknown_outcome_after_a_crash_writes_its_delivery(
    hook, dispatched, monkeypatch
):
    run, call, _ = factories.unknown(monkeypatch)
    (row,) = deliveries(event_type="tool_call.unknown")
    assert row.payload["data"]["tool_name"] == "charge_card"
    assert row.payload["data"]["run_state"] == RunState.AWAITING_APPROVAL
    # The call's arguments ({"amount_cents": 500}) stay out. (Not a search for "500" in
    # the payload's text: a random id holds those three characters one time in a few dozen.)
    assert "amount_cents" not in json.dumps(row.payload)
    assert 500 not in _values(row.payload)


def _values(value):
    """Every scalar inside a JSON value."""
    if isinstance(value, dict):
        return [v for item in value.values() for v in _values(item)]
    if isinstance(value, list):
        return [v for item in value for v in _values(item)]
    return [value]


@pytest.mark.django_db
def test_outbox__a_parked_run_cancelled_by_a_person(hook, dispatched):
    run, call, model = factories.parked()
    cancel_run(run, reason="not today")
    assert [d.event_type for d in deliveries()] == [
        "tool_call.awaiting_approval",
        "run.cancelled",
    ]


@pytest.mark.django_db(transaction=True)
def test_outbox__a_rolled_back_change_writes_and_sends_nothing(hook, dispatched):
    run = start_run("test-agent", "hello")
    with pytest.raises(RuntimeError), transaction.atomic():
        cancel_run(run, reason="changed my mind")
        assert deliveries(event_type="run.cancelled")  # inside the transaction
        raise RuntimeError("rolled back")
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert deliveries() == [] and dispatched == []
    cancel_run(run, reason="now")
    assert [d.event_type for d in deliveries()] == ["run.cancelled"]
    assert len(dispatched) == 1


@pytest.mark.django_db(transaction=True)
def test_outbox__a_refused_write_writes_no_delivery(hook, dispatched):
    run = start_run("test-agent", "hello")
    stale = Run.objects.get(pk=run.pk)
    cancel_run(run, reason="first")
    write = Write(stale)
    transitions.stop_run(write, stale, RunState.CANCELLED, "again")
    with pytest.raises(ConcurrentUpdate):
        send(write)
    assert len(deliveries()) == 1 and len(dispatched) == 1


@pytest.mark.django_db
def test_outbox__without_a_matching_subscription_a_run_costs_no_statement_more(
    settings, dispatched
):
    with CaptureQueriesContext(connection) as cold:
        factories.completed_run()
    # The admin's subscriptions are read once per process and cache period, and only by a
    # write with a reportable event (the run's last); then nothing more.
    reads = [q for q in cold.captured_queries if "webhook" in q["sql"].lower()]
    assert len(reads) == 1 and reads[0]["sql"].startswith("SELECT")
    with CaptureQueriesContext(connection) as plain:
        factories.completed_run()
    assert not [q for q in plain.captured_queries if "webhook" in q["sql"].lower()]
    assert len(plain.captured_queries) == len(cold.captured_queries) - 1
    # A subscription that wants other events: the admin's table is read (once, cached),
    # nothing is written, and the next run costs exactly what a run without any does.
    settings.AGENTRUN_WEBHOOKS = [
        {"name": "x", "url": "https://x.example/", "secret": SECRET, "events": ["run.failed"]}
    ]
    factories.completed_run()
    with CaptureQueriesContext(connection) as other:
        factories.completed_run()
    assert len(other.captured_queries) == len(plain.captured_queries)
    assert deliveries() == [] and dispatched == []


@pytest.mark.django_db
def test_outbox__admin_subscriptions_are_read_and_cached(settings, dispatched):
    WebhookSubscription.objects.create(
        name="crm", url="https://crm.example/hook", events=["run.failed"]
    )
    factories.failed_run()
    (row,) = deliveries()
    assert (row.subscription, row.event_type) == ("crm", "run.failed")
    assert row.payload["data"]["error_code"]


@pytest.mark.django_db
def test_deliver__signed_to_a_real_server_verified_with_the_library(hook, dispatched):
    factories.completed_run()
    (row,) = deliveries()
    assert webhooks.deliver(row.pk) == "delivered"
    (got,) = hook.received
    assert got.headers["webhook-id"] == row.webhook_id
    assert got.headers["content-type"] == "application/json"
    body = got.verified()
    assert body["type"] == "run.completed" and body["data"]["run_id"] == str(row.run_id)
    row.refresh_from_db()
    assert (row.status, row.attempts) == (DeliveryStatus.DELIVERED, 1)
    (attempt,) = WebhookAttempt.objects.filter(delivery=row)
    assert (attempt.status_code, attempt.response_excerpt) == (200, "ok")
    assert webhooks.deliver(row.pk) == "not due"  # delivered: never again
    assert len(hook.received) == 1


@pytest.mark.django_db
def test_deliver__a_failing_receiver_is_retried_each_try_recorded(hook, dispatched):
    hook.replies = [(500, b"boom", {}), (503, b"busy", {}), (200, b"ok", {})]
    factories.completed_run()
    (row,) = deliveries()
    assert [webhooks.deliver(row.pk) for _ in range(3)] == ["retrying", "retrying", "delivered"]
    codes = list(WebhookAttempt.objects.filter(delivery=row).values_list("number", "status_code"))
    assert codes == [(1, 500), (2, 503), (3, 200)]
    assert set(hook.ids()) == {row.webhook_id}
    # The short retries were handed to a worker with their countdown (the first hand-off
    # waits for a commit this test's transaction never makes).
    assert dispatched == [str(row.pk)] * 2


@pytest.mark.django_db
def test_deliver__gives_up_when_the_schedule_is_spent(hook, dispatched, settings):
    settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = [0]
    hook.replies = [(500, b"no", {})]
    factories.completed_run()
    (row,) = deliveries()
    assert [webhooks.deliver(row.pk) for _ in range(3)] == ["retrying", "failed", "not due"]
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_error) == (DeliveryStatus.FAILED, 2, "HTTP 500")


@pytest.mark.django_db
def test_deliver__a_later_retry_waits_for_its_time(hook, dispatched, settings):
    settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = [300]
    hook.replies = [(500, b"no", {})]
    factories.completed_run()
    (row,) = deliveries()
    assert webhooks.deliver(row.pk) == "retrying"
    row.refresh_from_db()
    assert 299 < (row.next_attempt_at - timezone.now()).total_seconds() <= 300
    assert webhooks.deliver(row.pk) == "not due"
    assert dispatched == []  # too far for a countdown: the reaper's pass sends it


@pytest.mark.django_db
def test_deliver__redirects_are_not_followed_and_bodies_are_cut(hook, dispatched):
    hook.replies = [(302, b"x" * 5000, {"location": hook.url + "/elsewhere"})]
    factories.completed_run()
    (row,) = deliveries()
    assert webhooks.deliver(row.pk) == "retrying"
    assert [r.path for r in hook.received] == ["/hook"]
    attempt = WebhookAttempt.objects.get(delivery=row)
    assert attempt.status_code == 302
    assert len(attempt.response_excerpt) == webhooks.EXCERPT_BYTES


@pytest.mark.django_db
def test_deliver__a_private_address_is_refused_unless_allowed(hook, dispatched, settings):
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = []
    factories.completed_run()
    (row,) = deliveries()
    assert webhooks.deliver(row.pk) == "retrying"  # tried again on the schedule (below)
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING and "loopback" in row.last_error
    assert hook.received == []
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.0/8"]
    webhooks.resend([row])
    assert webhooks.deliver(row.pk) == "delivered"
    assert hook.ids() == [row.webhook_id]


@pytest.mark.django_db
def test_deliver__the_name_is_resolved_once_and_the_checked_address_is_used(
    hook, dispatched, settings, monkeypatch
):
    # A name that resolves to an allowed address when checked and to another (say, a
    # private one the host did not allow) a moment later: the request goes to the first.
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1/32"]
    port = int(hook.url.rsplit(":", 1)[1].split("/")[0])
    real = socket.getaddrinfo
    asked: list[str] = []

    def rebinding(host, *args, **kwargs):
        if host != "hooks.rebind.test":
            return real(host, *args, **kwargs)
        asked.append(host)
        address = "127.0.0.1" if len(asked) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    settings.AGENTRUN_WEBHOOKS = [
        {
            "name": "ops",
            "url": f"http://hooks.rebind.test:{port}/hook",
            "secret": SECRET,
            "events": ["*"],
        }
    ]
    webhooks.forget_subscriptions()
    factories.completed_run()
    (row,) = deliveries()
    assert webhooks.deliver(row.pk) == "delivered"
    assert asked == ["hooks.rebind.test"]
    (got,) = hook.received
    assert got.headers["host"] == f"hooks.rebind.test:{port}"
    assert got.verified()["type"] == "run.completed"


@pytest.mark.django_db
def test_sweep__hands_over_deliveries_whose_task_was_lost(hook, dispatched, settings):
    factories.completed_run()
    (row,) = deliveries()
    dispatched.clear()
    assert webhooks.sweep() == 0  # just written: its task may still come
    WebhookDelivery.objects.filter(pk=row.pk).update(
        next_attempt_at=timezone.now() - timezone.timedelta(minutes=5)
    )
    assert webhooks.sweep() == 1 and dispatched == [str(row.pk)]
    assert webhooks.sweep() == 0  # due again only a grace period later
    assert webhooks.deliver(row.pk) == "delivered"


@pytest.mark.django_db
def test_admin__deliveries_show_their_tries_and_resend_under_the_same_id(
    hook, dispatched, client, django_capture_on_commit_callbacks
):
    factories.completed_run()
    (row,) = deliveries()
    webhooks.deliver(row.pk)
    nobody = factories.user("staff", is_staff=True)
    client.force_login(nobody)
    assert client.get("/admin/agentrun/webhookdelivery/").status_code == 403
    manager = factories.user("ops", "manage_webhooks", is_staff=True)
    client.force_login(manager)
    page = client.get(f"/admin/agentrun/webhookdelivery/{row.pk}/change/")
    assert page.status_code == 200 and b"ok" in page.content
    dispatched.clear()
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            "/admin/agentrun/webhookdelivery/",
            {"action": "resend", "_selected_action": [str(row.pk)]},
        )
    assert answer.status_code == 302
    row.refresh_from_db()
    assert (row.status, row.cycle, row.attempts) == (DeliveryStatus.PENDING, 2, 0)
    assert dispatched == [str(row.pk)]
    assert webhooks.deliver(row.pk) == "delivered"
    assert hook.ids() == [row.webhook_id, row.webhook_id]
    assert list(WebhookAttempt.objects.filter(delivery=row).values_list("cycle", "number")) == [
        (1, 1),
        (2, 1),
    ]


@pytest.mark.django_db
def test_admin__subscriptions_need_the_permission(client):
    client.force_login(factories.user("staff", is_staff=True))
    assert client.get("/admin/agentrun/webhooksubscription/add/").status_code == 403
    client.force_login(factories.user("ops", "manage_webhooks", is_staff=True))
    answer = client.post(
        "/admin/agentrun/webhooksubscription/add/",
        {
            "name": "crm",
            "url": "https://crm.example/hook",
            "secret": SECRET,
            "events": ["run.completed", "tool_call.awaiting_approval"],
            "active": "on",
        },
    )
    assert answer.status_code == 302, answer.content[:2000]
    sub = WebhookSubscription.objects.get(name="crm")
    assert sub.events == ["run.completed", "tool_call.awaiting_approval"]
    # The secret is shown when it is made, never again: the change page has its last
    # characters only, and saved with it blank it stays; a new one replaces it.
    page = client.get(f"/admin/agentrun/webhooksubscription/{sub.pk}/change/")
    assert page.status_code == 200
    assert SECRET.encode() not in page.content and SECRET[-4:].encode() in page.content
    form = {"name": "crm", "url": sub.url, "secret": "", "events": ["*"], "active": "on"}
    answer = client.post(f"/admin/agentrun/webhooksubscription/{sub.pk}/change/", form)
    assert answer.status_code == 302, answer.content[:2000]
    sub.refresh_from_db()
    assert (sub.secret, sub.events) == (SECRET, ["*"])
    other = "whsec_" + "A" * 32
    answer = client.post(
        f"/admin/agentrun/webhooksubscription/{sub.pk}/change/", {**form, "secret": other}
    )
    assert answer.status_code == 302
    sub.refresh_from_db()
    assert sub.secret == other
    bad = client.post(
        f"/admin/agentrun/webhooksubscription/{sub.pk}/change/",
        {**form, "secret": "whsec_not base64!"},
    )
    assert bad.status_code == 200 and b"Standard Webhooks secret" in bad.content


@pytest.mark.django_db
def test_email__the_approvers_are_mailed_from_the_outbox(settings, dispatched):
    settings.AGENTRUN_APPROVAL_EMAILS = True
    settings.AGENTRUN_WEBHOOK_ADMIN_URL = "https://ops.example.com"
    factories.user("approver", "approve_toolcall", email="a@example.com")
    factories.user("bystander", email="b@example.com")
    run, call, _ = factories.parked()
    (row,) = deliveries(kind="email")
    assert webhooks.deliver(row.pk) == "delivered"
    (message,) = mail.outbox
    assert message.to == ["a@example.com"]
    assert "delete_account" in message.subject
    assert f"/admin/agentrun/toolcall/{call.pk}/change/" in message.body


@pytest.mark.django_db
def test_outbox__admin_subscriptions_can_be_left_unread(settings, dispatched):
    settings.AGENTRUN_WEBHOOK_SUBSCRIPTIONS_CACHE_SECONDS = None
    WebhookSubscription.objects.create(name="crm", url="https://crm.example/", events=["*"])
    with CaptureQueriesContext(connection) as seen:
        factories.completed_run()
    assert not [q for q in seen.captured_queries if "webhook" in q["sql"].lower()]
    assert deliveries() == []


# --------------------------------------------------------------------------- as a newcomer meets them
# A secret long enough to sign with, what the admin shows escaped and in its one date format,
# a refused delivery retried on the schedule, `check` warning about a subscription a delivery
# will refuse (issue 37).

SHORT = "whsec_AA=="  # one byte


def secret_of(size: int) -> str:
    return "whsec_" + base64.b64encode(b"k" * size).decode()


@pytest.mark.django_db
def test_secret__at_least_24_bytes_in_settings():
    entry = {"name": "ops", "url": "https://hooks.example.com/", "events": ["*"]}
    for secret, refused in ((SHORT, True), (secret_of(23), True), (secret_of(24), False)):
        found = webhooks.problems([{**entry, "secret": secret}])
        assert bool(found) is refused, (secret, found)
    assert "at least 24" in webhooks.problems([{**entry, "secret": SHORT}])[0]


def manager(client):
    client.force_login(factories.user("ops", "manage_webhooks", is_staff=True))
    return client


@pytest.mark.django_db
def test_secret__at_least_24_bytes_in_the_admin(client):
    form = {"name": "crm", "url": "https://crm.example/hook", "events": ["*"], "active": "on"}
    refused = manager(client).post(
        "/admin/agentrun/webhooksubscription/add/", {**form, "secret": SHORT}
    )
    assert refused.status_code == 200 and b"at least 24" in refused.content
    assert not WebhookSubscription.objects.exists()
    made = client.post("/admin/agentrun/webhooksubscription/add/", {**form, "secret": SECRET})
    assert made.status_code == 302


@pytest.mark.django_db
def test_admin__the_secrets_end_is_escaped(client):
    sub = WebhookSubscription.objects.create(
        name="crm", url="https://crm.example/", secret=SECRET + "<img", events=["*"]
    )
    page = manager(client).get(f"/admin/agentrun/webhooksubscription/{sub.pk}/change/")
    assert page.status_code == 200
    assert b"&lt;img" in page.content and b"<img" not in page.content


@pytest.mark.django_db
def test_admin__lists_in_the_one_date_format_and_counts_in_words(hook, dispatched, client):
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


@pytest.mark.django_db
def test_deliver__a_refused_url_is_retried_on_the_schedule(hook, dispatched, settings):
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


@pytest.mark.django_db
def test_deliver__a_refused_url_fails_once_the_schedule_is_spent(hook, dispatched, settings):
    settings.AGENTRUN_WEBHOOK_ALLOWED_HOSTS = []
    factories.completed_run()
    (row,) = deliveries()
    outcomes = [webhooks.deliver(row.pk) for _ in range(3)]  # a schedule of two retries
    assert outcomes == ["retrying", "retrying", "failed"]


@pytest.mark.django_db
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


@pytest.mark.django_db
def test_deliver__a_receiver_answering_a_byte_at_a_time_is_given_up_within_the_timeout(
    hook, dispatched, settings
):
    """httpx bounds each read, not the whole answer: a receiver that trickles kept the try
    going past its hold, and another worker sent the same delivery beside it."""
    settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS = 1.0
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    done = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok":
            if done.wait(0.3):
                break
            conn.sendall(bytes([byte]))
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/slow"
    settings.AGENTRUN_WEBHOOKS = [{"name": "ops", "url": url, "secret": SECRET, "events": ["*"]}]
    factories.completed_run()
    (row,) = deliveries()
    began = time.monotonic()
    assert webhooks.deliver(row.pk) == "retrying"
    assert time.monotonic() - began < 2.5
    done.set()
    server.close()
    (attempt,) = WebhookAttempt.objects.filter(delivery=row)
    assert "within 1 s" in attempt.error


@pytest.mark.django_db
def test_deliver__a_try_whose_hold_was_taken_records_itself_not_the_delivery(
    hook, dispatched, monkeypatch
):
    """Its process stopped past its hold, another worker took the delivery: the late try's
    answer is recorded as an attempt, and the delivery stays the other try's."""
    from django_agentrun.webhooks import delivery as sending

    factories.completed_run()
    (row,) = deliveries()
    real = sending._post

    def taken_meanwhile(found):
        WebhookDelivery.objects.filter(pk=found.pk).update(locked_until=timezone.now())
        return real(found)

    monkeypatch.setattr(sending, "_post", taken_meanwhile)
    assert webhooks.deliver(row.pk) == "taken over"
    row.refresh_from_db()
    assert (row.status, row.attempts) == (DeliveryStatus.PENDING, 0)
    assert WebhookAttempt.objects.filter(delivery=row).count() == 1
