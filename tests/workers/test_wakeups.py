"""Lost wake-ups: a crash between the commit and the publish of the next advance_run, or a
broker that loses its messages, is recovered within lease + reaper interval; runs that
merely wait behind others in a busy queue get no duplicate messages."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_agentrun import start_run, wakeups
from django_agentrun.models import Run, RunEvent
from django_agentrun.recovery import reap
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import purge_queue
from tests.processes import wait_for

pytestmark = pytest.mark.timeout(90)


def test_crash_before_the_wakeup_is_published__recovered_within_lease_and_reaper_interval(
    workers, messages_api, settings
):
    settings.AGENTRUN_LEASE_SECONDS = 3
    interval = 1.0
    messages_api.script = by_step(
        [Reply([tool_use("lookup", {"query": "x"})]), Reply([text("Done.")])]
    )
    # A task per turn: the turn's end hands the run to the queue (release, then publish).
    env = {"AGENTRUN_LEASE_SECONDS": "3", "AGENTRUN_TURNS_PER_TASK": "1"}
    first = workers.start(failpoints="turn.before_enqueue=crash", **env)
    run = start_run("test-agent", "go")
    assert workers.wait_exit(first, timeout=30) != 0
    crashed = time.monotonic()
    workers.start(**env)

    def resumed():
        reap()  # the beat's reaper, every `interval`
        return RunEvent.objects.filter(run=run, type="turn_started").count() == 2

    wait_for(resumed, timeout=30, interval=interval, message="the next turn")
    took = time.monotonic() - crashed
    print(f"lost wake-up recovered {took:.2f}s after the crash")
    # lease + reaper interval + one worker start (measured here at most a few seconds)
    assert took < 3 + interval + 5, took
    wait_for(lambda: Run.objects.get(pk=run.pk).state == "completed", timeout=30)
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()


def _queued(n: int, ago: timedelta) -> list[Run]:
    runs = [start_run("test-agent", f"run {i}") for i in range(n)]
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(queued_at=timezone.now() - ago)
    return runs


def _requeued() -> int:
    return RunEvent.objects.filter(type="reaper_requeued").count()


def test_backlog__runs_waiting_in_a_busy_queue_get_no_duplicate_wakeups(postgres, queue, settings):
    settings.AGENTRUN_LEASE_SECONDS = 30  # re-send after 10 s, patience 300 s
    runs = _queued(5, timedelta(seconds=90))  # no worker: their messages wait in the queue
    wait_for(lambda: wakeups.queued_messages() == 5, timeout=5, message="5 messages queued")
    for _ in range(3):
        report = reap()
        assert not [f for f in report.findings if f.kind == "not_picked_up"]
    assert wakeups.queued_messages() == 5
    assert _requeued() == 0

    # The broker lost them (a restart without persistence): each run is woken once.
    purge_queue(queue)
    assert wakeups.queued_messages() == 0
    report = reap()
    assert sorted(f.run_id for f in report.findings if f.kind == "not_picked_up") == sorted(
        str(r.pk) for r in runs
    )
    assert wakeups.queued_messages() == 5
    reap()
    assert _requeued() == 5  # the next pass sends nothing more


def test_backlog__runs_waiting_longer_than_any_patience_are_never_rewoken(
    postgres, queue, settings
):
    """A backlog is not a lost message: the reaper reads the broker's queue and finds each
    run's own wake-up there, however long it has waited (before: after ten leases every
    waiting run got a duplicate, 583 at once in a 1,000-run load test)."""
    settings.AGENTRUN_LEASE_SECONDS = 3
    _queued(3, timedelta(minutes=10))
    wait_for(lambda: wakeups.queued_messages() == 3, timeout=5, message="3 messages queued")
    for _ in range(3):
        report = reap()
        assert not [f for f in report.findings if f.kind == "not_picked_up"]
    assert _requeued() == 0
    assert wakeups.queued_messages() == 3


def test_lost_wakeup__a_message_that_died_with_its_worker_is_resent(postgres, queue, settings):
    """A worker took two wake-ups off the queue (kombu's `unacked` hash holds them until they
    are acknowledged) and died before claiming one of them: its message would come back only
    after the broker's visibility timeout (an hour). The one delivered a moment ago is a
    worker's about to claim it: left alone; the one delivered a lease ago is re-sent."""
    settings.AGENTRUN_LEASE_SECONDS = 3
    fresh, dead = _queued(2, timedelta(minutes=1))
    wait_for(lambda: wakeups.queued_messages() == 2, timeout=5, message="2 messages queued")
    _deliver_all(queue, {str(fresh.pk): 0.0, str(dead.pk): 10.0})
    assert wakeups.queued_messages() == 0
    report = reap()
    lost = [f.run_id for f in report.findings if f.kind == "not_picked_up"]
    assert lost == [str(dead.pk)]
    assert wakeups.waiting_runs() >= {str(fresh.pk), str(dead.pk)}  # re-sent: queued again
    reap()
    assert _requeued() == 1


def _deliver_all(queue: str, ago: dict[str, float]) -> None:
    """Move every message of `queue` to the `unacked` hash as a worker's consumer does,
    delivered `ago[run_id]` seconds ago."""
    from example_project.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        while raw := client.rpop(queue):
            message = json.loads(raw)
            run_id = message["headers"]["argsrepr"].strip("()[]',")
            tag = message["properties"]["delivery_tag"]
            client.hset(channel.unacked_key, tag, json.dumps([message, "", queue]))
            client.zadd(channel.unacked_index_key, {tag: time.time() - ago[run_id]})
