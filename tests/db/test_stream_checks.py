"""The re-check of open streams batched per user and event loop (issue #40): one read for
all of a user's open streams each AGENTRUN_STREAM_RECHECK_SECONDS, not one per stream; a
failing check ends only the streams it concerns; the places renewed together."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.test import AsyncClient
from django.urls import reverse

from django_agentrun import start_run
from django_agentrun.api import stream_reads
from django_agentrun.streams import limits
from tests import factories
from tests.db.test_stream_bounds import Reader

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]


def url(run) -> str:
    return reverse("agentrun:run-stream", args=[run.pk])


@pytest.fixture
def quick(settings):
    settings.AGENTRUN_STREAM_KEEPALIVE_SECONDS = 0.1
    settings.AGENTRUN_STREAM_POLL_SECONDS = 0.1
    settings.AGENTRUN_STREAM_RECHECK_SECONDS = 0.2
    settings.AGENTRUN_STREAM_MAX_PER_USER = None
    return settings


def test_checks__one_read_a_round_for_all_of_a_users_streams(quick, monkeypatch):
    alice = factories.user("alice")
    runs = [start_run("test-agent", f"nobody works on me {n}", owner=alice) for n in range(4)]
    calls: list[int] = []
    original = stream_reads.allowed

    async def counting(user_id, sessions, run_ids, conversations):
        calls.append(len(run_ids))
        return await original(user_id, sessions, run_ids, conversations)

    monkeypatch.setattr(stream_reads, "allowed", counting)

    async def go():
        readers = []
        started = time.monotonic()  # the first stream's checks start with it
        for n in range(12):
            client = AsyncClient()
            await client.aforce_login(alice)
            readers.append(Reader(await client.get(url(runs[n % 4]))))
        await asyncio.gather(*(r.read_for(1.1) for r in readers))
        took = time.monotonic() - started
        made = list(calls)  # the checks while all twelve were open
        ended = [r.ended for r in readers]
        for r in readers:
            await r.close()
        return took, made, ended

    took, made, ended = async_to_sync(go)()
    assert not any(ended)
    rounds = took / 0.2
    # One read per round for the twelve streams (each naming the four runs), not twelve.
    assert 2 <= len(made) <= rounds + 1, (len(made), rounds)
    assert made[-1] == 4  # every run watched, in one read


def test_checks__a_failing_check_ends_only_the_streams_it_concerns(quick):
    alice = factories.user("alice")
    viewer = factories.user("viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_all_runs"))
    alices = start_run("test-agent", "nobody works on me", owner=alice)
    viewers = start_run("test-agent", "nor on me", owner=viewer)

    async def go():
        readers = []
        for path in (url(alices), url(alices), url(viewers)):
            client = AsyncClient()
            await client.aforce_login(viewer)
            readers.append(Reader(await client.get(path)))
        await asyncio.gather(*(r.read_for(0.5) for r in readers))
        await sync_to_async(viewer.user_permissions.clear)()
        await asyncio.gather(*(r.read_for(0.8) for r in readers))
        ended = [r.ended for r in readers]
        for r in readers:
            await r.close()
        return ended

    # Stripped of view_all_runs: alice's run is gone from view, the viewer's own is not.
    assert async_to_sync(go)() == [True, True, False]


def test_checks__renew_every_place_of_the_users_streams(quick, stream_redis):
    import redis

    alice = factories.user("alice")
    quick.AGENTRUN_STREAM_MAX_PER_USER = 10
    run = start_run("test-agent", "nobody works on me", owner=alice)
    server = redis.Redis.from_url(stream_redis)

    async def go():
        readers = []
        for _ in range(5):
            client = AsyncClient()
            await client.aforce_login(alice)
            readers.append(Reader(await client.get(url(run))))
        await asyncio.gather(*(r.read_for(0.1) for r in readers))
        first = dict(server.zrange(limits.user_key(alice.pk), 0, -1, withscores=True))
        await asyncio.gather(*(r.read_for(0.6) for r in readers))
        later = dict(server.zrange(limits.user_key(alice.pk), 0, -1, withscores=True))
        for r in readers:
            await r.close()
        return first, later

    first, later = async_to_sync(go)()
    assert len(first) == 5 and set(later) == set(first)
    assert all(later[token] > first[token] for token in first)  # each place renewed
