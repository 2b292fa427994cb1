"""Ownership holds across machines (invariant 9), and an expired lease means its executor
is gone: leases judged by the database's clock, never taken on `host:pid` from a worker in
another PID namespace, heartbeats that reconnect, and a worker that cannot renew stops (or
ends itself) before its lease can expire."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_agentrun import start_run, store
from django_agentrun.abort import AbortSignal
from django_agentrun.engine.heartbeat import EXIT_CODE, Heartbeat
from django_agentrun.identity import holder_is_dead, worker_identity
from django_agentrun.models import Run, RunEvent
from django_agentrun.recovery import reap
from django_agentrun.tasks import advance_run
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_for
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(90)


def _other_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


def _db_now():
    return store.database_now()


# --------------------------------------------------------------------------- clocks


def test_claim__expiry_is_judged_by_the_database_clock(postgres, monkeypatch):
    run = start_run("hardening", "x")
    first = store.claim(run.pk, worker_identity(), history=False)
    assert first is not None
    # This app server's clock runs two minutes ahead of the others and of the database.
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(minutes=2))
    assert store.claim(run.pk, worker_identity(), history=False) is None
    report = reap()
    assert not [f for f in report.findings if f.run_id == str(run.pk)]
    row = Run.objects.get(pk=run.pk)
    assert row.lease_epoch == first.lease.epoch and row.lease_owner == first.lease.owner


def test_identity__a_holder_in_another_pid_namespace_is_never_dead_here(postgres):
    out = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            sys.executable,
            "-m",
            "tests.workers.pidns_launch",
            sys.executable,
            "-c",
            "from django_agentrun.identity import worker_identity; print(worker_identity())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pid = out.split(":")[1]
    assert not os.path.exists(f"/proc/{pid}")  # the launcher picked a pid unused here
    assert not holder_is_dead(out)
    # The same process seen from its own namespace would be provably dead here:
    mine = worker_identity().split(":")
    mine[1] = pid
    assert holder_is_dead(":".join(mine))


# --------------------------------------------------------------------------- heartbeat


def test_heartbeat__reconnects_after_its_database_backend_is_terminated(postgres, settings):
    # Renewals every 2 s; without them the watchdog would end this process 5.4 s after the
    # last one: the assertion below (3 s after the kill) comes first.
    settings.AGENTRUN_LEASE_SECONDS = 6
    settings.AGENTRUN_HEARTBEAT_SECONDS = 0.2
    run = start_run("hardening", "x")
    claimed = store.claim(run.pk, worker_identity(), history=False)
    abort = AbortSignal()
    before = set(_other_backends())
    beat = Heartbeat(claimed.lease, abort)
    beat.start()
    try:
        fresh = wait_for(
            lambda: set(_other_backends()) - before, timeout=5, message="its connection"
        )
        with connection.cursor() as cursor:
            for pid in fresh:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        killed_at = _db_now()

        def renewed_since():
            expires = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
            return expires > killed_at + timedelta(seconds=6)  # renewed after the kill

        wait_for(renewed_since, timeout=3, interval=0.1, message="a renewal after the kill")
        assert not abort.aborted
    finally:
        beat.stop()


# --------------------------------------------------------------------------- real workers


def _slow_script(tool_name: str, arguments: dict) -> object:
    return by_step(
        [
            Reply([tool_use(tool_name, arguments, id="toolu_slow")]),
            Reply([text("Done.")]),
        ]
    )


def _started(kind: str) -> list[dict]:
    return [r for r in executions(kind) if r.get("phase") == "start"]


def test_duplicate_delivery__a_live_worker_in_another_pid_namespace_keeps_its_lease(
    workers, messages_api, queue, settings
):
    """Worker A runs in its own PID namespace (a container sharing the host name); its pid
    names no process here. Worker B gets a duplicate message for A's run: it must leave the
    run alone (before: B saw `host:pid` dead and took the lease over, re-running the tool
    beside A)."""
    messages_api.script = _slow_script("slow_read", {"seconds": 4, "label": "a"})
    env = {"AGENTRUN_LEASE_SECONDS": "30"}
    prefix = ("unshare", "--pid", "--fork", *_launcher())
    workers.start(prefix=prefix, **env)
    run = start_run("hardening", "Read it.")
    wait_for(lambda: _started("slow_read"), timeout=30, message="A to start the tool")
    workers.start(**env)
    advance_run.apply_async(args=[str(run.pk)], queue=queue)  # the duplicate, for B
    time.sleep(1.5)  # B has received and handled it (it takes well under a second)
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed")
    assert len(_started("slow_read")) == 1, executions()
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert_projection_matches(run)


def test_unrenewable_lease__a_stubborn_handler_ends_its_process_before_the_lease_expires(
    workers, messages_api, settings
):
    """Renewals hang (the run row is locked, as behind a dead connection): the worker must be
    gone before its lease expires, so recovery never runs the call beside it."""
    settings.AGENTRUN_LEASE_SECONDS = 3
    env = {"AGENTRUN_LEASE_SECONDS": "3", "AGENTRUN_CANCEL_GRACE_SECONDS": "5"}
    messages_api.script = _slow_script("stubborn", {"seconds": 20})
    first = workers.start(**env)
    run = start_run("hardening", "Work.")
    wait_for(lambda: _started("stubborn"), timeout=30, message="the handler to start")
    with _row_locked(run):
        code = workers.wait_exit(first, timeout=10)
        still_leased = Run.objects.filter(
            pk=run.pk, lease_expires_at__gt=store.database_now()
        ).exists()
    assert code == EXIT_CODE, workers.logs()
    assert still_leased, "the process outlived its lease"
    assert not [r for r in executions("stubborn") if r["phase"] == "end"]
    workers.start(**env)
    settings.AGENTRUN_LEASE_SECONDS = 3

    def finished():
        reap()
        return _state(run) == "completed"

    wait_for(finished, timeout=60, interval=0.3, message="recovered and completed")
    starts = _started("stubborn")
    assert len(starts) == 2  # read_only: re-run after recovery, never beside the first


def test_unrenewable_lease__a_cooperative_handler_stops_and_records_nothing(
    workers, messages_api, settings
):
    settings.AGENTRUN_LEASE_SECONDS = 3
    env = {"AGENTRUN_LEASE_SECONDS": "3", "AGENTRUN_CANCEL_GRACE_SECONDS": "5"}
    messages_api.script = _slow_script("slow_read", {"seconds": 20, "label": "c", "once": True})
    worker = workers.start(**env)
    run = start_run("hardening", "Read.")
    wait_for(lambda: _started("slow_read"), timeout=30, message="the handler to start")
    with _row_locked(run):
        wait_for(
            lambda: "could not be renewed" in worker.log_path.read_text(errors="replace"),
            timeout=10,
            message="the watchdog to abort",
        )
    # The handler stopped; its call was not closed as "cancelled": recovery re-runs it.
    wait_for(lambda: _state(run) == "completed", timeout=60, message="completed")
    call = run.tool_calls.get()
    assert call.result == "read c"
    assert worker.poll() is None  # it stopped in time: no need to end the process


@pytest.mark.both_drivers
def test_heartbeat__a_worker_keeps_its_lease_through_terminated_backends(
    workers, messages_api, settings
):
    """In a real worker: the heartbeat's database backend is terminated three times while a
    tool runs for longer than the lease, each time once the previous kill was followed by a
    renewal. The heartbeat reconnects and renews: the tool runs once, nothing is recovered
    (without the reconnect the watchdog would stop the tool 1.5 s in and recovery would run
    it again)."""
    env = {"AGENTRUN_LEASE_SECONDS": "3", "AGENTRUN_HEARTBEAT_SECONDS": "0.2"}
    messages_api.script = _slow_script("slow_read", {"seconds": 6, "label": "hb"})
    worker = workers.start(**env)
    run = start_run("hardening", "Read.")
    wait_for(lambda: _started("slow_read"), timeout=30, message="the handler to start")
    for _ in range(3):
        killed = wait_for(_terminate_heartbeat_backends, timeout=5, message="a heartbeat")
        killed_at = _db_now()

        wait_for(
            lambda since=killed_at: _expires(run) > since + timedelta(seconds=2),
            timeout=2,
            interval=0.05,
            message=f"a renewal after terminating {killed}",
        )
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed")
    log = worker.log_path.read_text(errors="replace")
    assert log.count("Heartbeat failed") >= 1, log[-3000:]
    assert len(_started("slow_read")) == 1, executions()
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert run.tool_calls.get().attempt == 1
    assert_projection_matches(run)


def _expires(run: Run):
    return Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)


def _terminate_heartbeat_backends() -> int:
    """Terminate the backends whose last statement was a heartbeat's (a renewal or a cancel
    poll): the worker's own connection, which ran the in_flight write, is left alone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            'AND (query LIKE \'SELECT "lease_epoch", "lease_owner"%%\' '
            'OR query LIKE \'UPDATE "agentrun_run" SET "lease_expires_at"%%\')'
        )
        return len(cursor.fetchall())


@contextmanager
def _row_locked(run: Run) -> Iterator[None]:
    """Another session holds the run's row FOR UPDATE, as behind a dead connection: the
    worker's lease renewals hang until the block ends."""
    locker = connections.create_connection("default")
    try:
        with locker.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT 1 FROM agentrun_run WHERE id = %s FOR UPDATE", [run.pk.hex])
            yield
            cursor.execute("ROLLBACK")
    finally:
        locker.close()


def _state(run: Run) -> str:
    run.refresh_from_db()
    return run.state


def _launcher() -> tuple[str, ...]:
    return (sys.executable, "-m", "tests.workers.pidns_launch")
