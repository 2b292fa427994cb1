"""A live stream ends with the session that opened it (logout, a password changed elsewhere,
the session's expiry), within its periodic re-check; HEAD and POST answer at once, in JSON
where there is a body (issue 37)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.sessions.models import Session
from django.test import AsyncClient, Client
from django.utils import timezone

from django_agentrun import start_run
from tests import factories
from tests.conftest import assert_api_error
from tests.db.test_stream_bounds import Reader, url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]


@pytest.fixture
def quick(settings):
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.1
    settings.AGENTRUN_STREAM_POLL_SECONDS = 0.1
    settings.AGENTRUN_STREAM_RECHECK_SECONDS = 0.2
    return settings


@pytest.fixture
def alice():
    return factories.user("alice")


def password_changed(client, user):
    user.set_password("changed elsewhere")  # another session of theirs (no session rehash)
    user.save()


def logged_out(client, user):
    async_to_sync(client.alogout)()


def expired(client, user):
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))


def still_signed_in(client, user):
    pass


@pytest.mark.parametrize(
    ("change", "ends"),
    [(still_signed_in, False), (logged_out, True), (password_changed, True), (expired, True)],
)
def test_stream__ends_with_the_session_that_opened_it(quick, alice, change, ends):
    run = start_run("test-agent", "nobody works on me", owner=alice)  # queued: it stays open

    async def go():
        client = AsyncClient()
        await client.alogin(username="alice", password="pw")
        reader = Reader(await client.get(url(run)))
        assert reader.response.status_code == 200
        first = await reader.read_for(0.6)
        assert not reader.ended and "run_created" in first
        await sync_to_async(change)(client, alice)
        await reader.read_for(1.2)
        ended = reader.ended
        await reader.close()
        return ended

    assert async_to_sync(go)() is ends


def test_head__answers_at_once_and_holds_no_place(quick, alice):
    quick.AGENTRUN_STREAM_MAX_PER_USER = 1
    run = start_run("test-agent", "nobody works on me", owner=alice)
    client = Client()
    client.force_login(alice)
    for _ in range(3):
        response = client.head(url(run))
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream; charset=utf-8"
        assert not response.streaming and response.content == b""

    async def go():
        other = AsyncClient()
        await other.aforce_login(alice)
        reader = Reader(await other.get(url(run)))  # the one place is free
        status = reader.response.status_code
        await reader.close()
        return status

    assert async_to_sync(go)() == 200


def test_post__a_json_405_even_with_a_session_and_no_csrf_token(alice):
    run = start_run("test-agent", "nobody works on me", owner=alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    for method in (client.post, client.put, client.delete):
        response = method(url(run))
        assert_api_error(response, 405, "method_not_allowed")
        assert response["Allow"] == "GET, HEAD"
