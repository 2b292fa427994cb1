"""A process that was stopped or starved past its lease looks before it acts (the schedule
explorer's long run, batch seed 110214): its step, not only its watchdog, asks for the lease
back before a model request or a tool's handler (AbortSignal.before_effect, Heartbeat.gate).
After a stop both threads resume at once, and the step could send the model request for the
turn the run's new holder had already asked for, before the watchdog woke.

A real heartbeat on its own connection; "the process was late" is the lease's deadline by
this process's monotonic clock put in the past, as a stop of that length would leave it."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from django_agentrun import start_run, store
from django_agentrun.abort import LEASE_LOST, AbortSignal
from django_agentrun.engine import heartbeat as hb
from django_agentrun.identity import worker_identity
from django_agentrun.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def beat(settings, monkeypatch):
    """A heartbeat whose own renewals come too rarely to act within the test: only the gate
    asks for one. Its ending of the process is recorded instead of done."""
    settings.AGENTRUN_LEASE_SECONDS = 30
    settings.AGENTRUN_HEARTBEAT_SECONDS = 5
    ended = threading.Event()
    monkeypatch.setattr(hb.Heartbeat, "_exit", lambda self: ended.set())
    run = start_run("hardening", "x")
    claimed = store.claim(run.pk, worker_identity(), history=False)
    abort = AbortSignal()
    found = hb.Heartbeat(claimed.lease, abort)
    found.start()
    found.ended = ended
    yield found
    found.stop()


def _lapse(beat, *, taken: bool) -> None:
    """The process was stopped past its lease; meanwhile it ran out in the database and,
    if `taken`, another worker claimed the run."""
    beat.valid_until = time.monotonic() - 1
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agentrun_run SET lease_expires_at = statement_timestamp()"
            " - interval '1 second' WHERE id = %s",
            [beat.lease.run_id],
        )
    if taken:
        assert store.claim(beat.lease.run_id, "other-host:1:x", history=False) is not None


def test_gate__on_time__nothing_to_do(beat):
    assert beat.abort.before_effect() is False
    assert beat.taken_back == 0 and not beat.ended.is_set()


def test_gate__late_and_the_run_taken__the_effect_never_starts(beat):
    _lapse(beat, taken=True)
    assert beat.abort.aborted is False  # the watchdog has not woken: without the gate, on
    assert beat.abort.before_effect() is True
    assert beat.abort.reason == LEASE_LOST
    assert beat.ended.wait(5), "the process did not end itself"


def test_gate__late_and_nobody_took_the_run__takes_the_lease_back_and_goes_on(beat):
    _lapse(beat, taken=False)
    assert beat.abort.before_effect() is False
    assert beat.taken_back == 1 and not beat.ended.is_set()
    row = Run.objects.values_list("lease_owner", "lease_epoch").get(pk=beat.lease.run_id)
    assert row == (beat.lease.owner, beat.lease.epoch)
    assert beat.valid_until > time.monotonic() + 20  # renewed for a whole lease


def test_gate__after_the_step__does_nothing(beat):
    beat.stop()
    _lapse(beat, taken=True)
    assert beat.abort.gate is None
    assert beat.abort.before_effect() is False


def test_give_up__the_beat_stops_before_the_lease_is_let_run_out(beat, monkeypatch):
    """A step stopped for an unrenewable lease lets it run out (Then.EXPIRE): the beat has
    stopped by then, so no renewal of its follows the expiry and makes the lease live again
    (the wake-up's claim would find it held)."""
    beats_alive = []
    expire = store.expire_lease

    def watched(lease):
        name = f"agentrun-heartbeat-{lease.run_id}"
        beats_alive.append(any(t.name == name and t.is_alive() for t in threading.enumerate()))
        return expire(lease)

    monkeypatch.setattr(hb.store, "expire_lease", watched)
    assert beat.give_up() is True
    assert beats_alive == [False]
    assert not beat.ended.is_set()
    row = Run.objects.values_list("lease_owner", "lease_epoch").get(pk=beat.lease.run_id)
    assert row == (beat.lease.owner, beat.lease.epoch + 1)
    assert store.renew_lease(beat.lease) == (False, False)
