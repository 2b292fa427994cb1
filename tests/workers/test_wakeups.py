"""Lost wake-ups: a crash between the commit and the publish of the next advance_run, or a
broker that loses its messages, is recovered within lease + reaper interval; runs that
merely wait behind others in a busy queue get no duplicate messages."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
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


def _deliver_all(queue: str, ago: dict[str, float], eta_ahead: float | None = None) -> None:
    """Move every message of `queue` to the `unacked` hash as a worker's consumer does,
    delivered `ago[run_id]` seconds ago (by the worker's clock); `eta_ahead`: its eta moved
    that many seconds ahead (a publisher's clock running ahead)."""
    from example_project.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        while raw := client.rpop(queue):
            message = json.loads(raw)
            run_id = message["headers"]["argsrepr"].strip("()[]',")
            if eta_ahead is not None:
                eta = datetime.now(UTC) + timedelta(seconds=eta_ahead)
                message["headers"]["eta"] = eta.isoformat()
            tag = message["properties"]["delivery_tag"]
            client.hset(channel.unacked_key, tag, json.dumps([message, "", queue]))
            client.zadd(channel.unacked_index_key, {tag: time.time() - ago[run_id]})


# --------------------------------------------------------------------------- slow, not lost


def _reap_elsewhere() -> object:
    """A reaper pass on a thread (and a database connection) of its own."""
    found: list = []

    def reap_once() -> None:
        try:
            found.append(reap())
        finally:
            connection.close()

    thread = threading.Thread(target=reap_once)
    thread.start()
    thread.join(timeout=30)
    return found[0]


def _lost(report) -> list[str]:
    return [f.run_id for f in report.findings if f.kind == "not_picked_up"]


@pytest.mark.parametrize("when", ["before_the_first", "between_two"])
def test_big_commit__wakeups_still_being_published_are_not_taken_for_lost(
    postgres, queue, settings, monkeypatch, when
):
    """Issue #35: 1,000 runs started in one transaction are stale by the time it commits
    (queued when they were created), and their wake-ups are published one by one after the
    commit (52 s of it on a saturated machine). The reaper passed meanwhile, found no
    message for most of them and re-sent 616 wake-ups. The commit now announces them to the
    broker before publishing the first: a pass before the first wake-up goes out, or
    between two, re-sends none."""
    settings.AGENTRUN_LEASE_SECONDS = 3
    passes: list = []
    publish = wakeups.send

    def send_slowly(run_id, countdown=None):
        if not passes and when == "before_the_first":
            passes.append(_reap_elsewhere())
        publish(run_id, countdown)
        if not passes and when == "between_two":
            passes.append(_reap_elsewhere())

    monkeypatch.setattr(wakeups, "send", send_slowly)
    with transaction.atomic():  # a long transaction: its runs are stale at its commit
        runs = [start_run("test-agent", f"run {i}") for i in range(5)]
        Run.objects.filter(pk__in=[r.pk for r in runs]).update(
            queued_at=timezone.now() - timedelta(minutes=1)
        )
    assert _lost(passes[0]) == []
    assert wakeups.queued_messages() == 5  # each wake-up once
    assert _requeued() == 0


def test_big_commit__a_publisher_that_died_after_announcing__its_runs_are_rewoken(
    postgres, queue, settings, monkeypatch
):
    """An announcement is not a message: one whose publisher died (nothing published)
    expires (the broker's clock: at least ANNOUNCEMENT_MIN_SECONDS, 30 s; 1 s here), and
    the reaper then wakes each of its runs once."""
    settings.AGENTRUN_LEASE_SECONDS = 1
    monkeypatch.setattr(wakeups, "ANNOUNCEMENT_MIN_SECONDS", 1.0)

    class Died(BaseException):
        """The publishing process ends before its first publish (nothing after runs)."""

    def die(run_id, countdown=None):
        raise Died

    publish = wakeups.send
    monkeypatch.setattr(wakeups, "send", die)
    with pytest.raises(Died), transaction.atomic():
        runs = [start_run("test-agent", f"run {i}") for i in range(3)]
        Run.objects.filter(pk__in=[r.pk for r in runs]).update(
            queued_at=timezone.now() - timedelta(minutes=1)
        )
    monkeypatch.setattr(wakeups, "send", publish)
    assert Run.objects.filter(pk__in=[r.pk for r in runs]).count() == 3  # committed
    assert wakeups.queued_messages() == 0
    assert _lost(reap()) == []  # announced a moment ago: on their way
    wait_for(lambda: _lost(reap()), timeout=5, interval=0.3, message="the announcement to expire")
    assert _requeued() == 3
    assert wakeups.queued_messages() == 3
    reap()
    assert _requeued() == 3


def test_big_commit__an_announcement_that_lapsed_in_a_stall_is_made_again(
    postgres, queue, settings, monkeypatch
):
    """A publisher stalled past its announcement's life (a saturated machine) announces the
    wake-ups still to come again with its next one."""
    settings.AGENTRUN_LEASE_SECONDS = 1
    monkeypatch.setattr(wakeups, "ANNOUNCEMENT_MIN_SECONDS", 1.0)
    announced: list[set[str]] = []
    publish = wakeups.send

    def send_stalled(run_id, countdown=None):
        if len(announced) == 1:
            time.sleep(1.3)  # the announcement lapses
        announced.append(_announcements())
        publish(run_id, countdown)

    monkeypatch.setattr(wakeups, "send", send_stalled)
    with transaction.atomic():
        runs = [str(start_run("test-agent", f"run {i}").pk) for i in range(4)]
    ours = [found & set(runs) for found in announced]  # another test's may linger a moment
    assert ours[0] == set(runs)
    assert ours[1] == set()  # lapsed
    assert ours[2] == set(runs[2:])  # the ones still to go out, again
    assert not _announcements() & set(runs)  # withdrawn after the last
    assert wakeups.queued_messages() == 4


def _announcements() -> set[str]:
    """The run ids the broker's live announcements name."""
    from example_project.celery import app

    with app.connection_for_read() as conn:
        client = conn.default_channel.client
        keys = client.smembers(wakeups.COMING)
        return {m.decode() for key in keys for m in client.smembers(key)}


def test_lost_wakeup__a_worker_clock_ahead_cannot_keep_a_dead_message_fresh(
    postgres, queue, settings
):
    """kombu dates a delivery by the consuming worker's clock. A worker whose clock ran an
    hour ahead took a wake-up and died: by that date the message looked fresh for an hour
    (the run waited that long). The reaper's own first sight of it (the broker's clock)
    makes it old a lease later."""
    settings.AGENTRUN_LEASE_SECONDS = 1
    (run,) = _queued(1, timedelta(minutes=1))
    wait_for(lambda: wakeups.queued_messages() == 1, timeout=5, message="1 message queued")
    _deliver_all(queue, {str(run.pk): -3600.0})  # delivered "an hour from now"
    assert _lost(reap()) == []  # first seen now: a worker may be about to claim it
    time.sleep(1.2)
    assert _lost(reap()) == [str(run.pk)]
    reap()
    assert _requeued() == 1


def test_countdown__judged_by_the_broker_clock_not_the_publisher_eta(postgres, queue, settings):
    """A countdown's `eta` is the publishing worker's clock: one an hour ahead put a
    0.5 s wait an hour out, and the reaper, trusting it, left the run waiting. The wait is
    now counted from the reaper's first sight of the message (the countdown travels as a
    header): after it and a lease, a run still unclaimed is woken again."""
    settings.AGENTRUN_LEASE_SECONDS = 1
    (run,) = _queued(1, timedelta(minutes=1))
    wait_for(lambda: wakeups.queued_messages() == 1, timeout=5, message="1 message queued")
    purge_queue(queue)
    wakeups.send(run.pk, countdown=0.5)
    _deliver_all(queue, {str(run.pk): 0.0}, eta_ahead=3600)  # a worker holds it until "then"
    assert _lost(reap()) == []  # its countdown still to run
    time.sleep(1.7)  # the countdown and a lease
    assert _lost(reap()) == [str(run.pk)]
