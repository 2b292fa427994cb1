"""Lost wake-ups: a crash between the commit and the publish of the next advance_run, or a
broker that loses its messages, is recovered within lease + reaper interval; runs that
merely wait behind others in a busy queue get no duplicate messages."""

from __future__ import annotations

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


def test_backlog__patience_runs_out__woken_once_more(postgres, queue, settings):
    settings.AGENTRUN_LEASE_SECONDS = 30
    _queued(2, timedelta(minutes=10))
    wait_for(lambda: wakeups.queued_messages() == 2, timeout=5, message="2 messages queued")
    reap()
    assert _requeued() == 2
    reap()
    assert _requeued() == 2
