"""The reaper on Postgres: two reapers at once act on each stuck run once, reconcile_runs
(dry run, --run, --stale-after), its scans use their partial indexes, deadlines, and a dead
worker's non_idempotent call in flight handed to a person."""

from __future__ import annotations

import io
import threading
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_agentrun import start_run
from django_agentrun.engine import Outcome, advance
from django_agentrun.models import Run, RunEvent, ToolCall, Turn
from django_agentrun.recovery import reap
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.factories import crashed_at
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Nothing here needs a worker: the reaper's wake-ups are recorded, not sent."""


@pytest.fixture(autouse=True)
def _log(test_log):
    """The test tools log their executions to a file of this test's own."""


def stale_queued(minutes=60):
    run = start_run("test-agent", "hello")
    Run.objects.filter(pk=run.pk).update(queued_at=timezone.now() - timedelta(minutes=minutes))
    return run


def state_of_db():
    runs = list(Run.objects.order_by("pk").values())
    events = list(RunEvent.objects.order_by("run_id", "seq").values_list("run_id", "seq", "type"))
    calls = list(ToolCall.objects.order_by("pk").values())
    turns = list(Turn.objects.order_by("pk").values())
    return runs, events, calls, turns


def finish(run, script):
    """Drive a recovered run to its end in-process (the wake-up the stub did not deliver)."""
    client = ScriptedClient(script)
    drive(run, client, limit=10)
    return client


def kinds(run):
    return Counter(RunEvent.objects.filter(run_id=run.pk).values_list("type", flat=True))


def two_reapers(**kwargs):
    barrier = threading.Barrier(2)
    reports: list[object] = [None, None]
    errors: list[BaseException | None] = [None, None]

    def body(i):
        try:
            barrier.wait(timeout=10)
            reports[i] = reap(**kwargs)
        except BaseException as exc:  # noqa: BLE001
            errors[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
        assert not t.is_alive()
    assert errors == [None, None], errors
    return reports


# --------------------------------------------------------------------------- two reapers


def test_two_reapers__stale_queued_runs_requeued_once(postgres, no_broker):
    runs = [stale_queued() for _ in range(30)]
    no_broker.clear()
    reports = two_reapers(stale_after=60)
    done = Counter(f.run_id for r in reports for f in r.findings if f.done)
    assert done == Counter({str(run.pk): 1 for run in runs})
    for run in runs:
        assert kinds(run)["reaper_requeued"] == 1
        run.refresh_from_db()
        assert run.state == "queued"
        assert run.queued_at > timezone.now() - timedelta(minutes=1)
        assert_projection_matches(run)
    assert Counter(no_broker) == Counter({str(run.pk): 1 for run in runs})


def test_two_reapers__expired_leases_recovered_once(postgres, monkeypatch, no_broker):
    script = [reply(tool_use("lookup", {"query": "q"})), reply(text("ok"))]
    runs = [crashed_at(monkeypatch, "tool.before_handler", script) for _ in range(12)]
    for run in runs:
        assert run.tool_calls.get().state == "in_flight"
    no_broker.clear()
    reports = two_reapers(stale_after=60)
    for run in runs:
        run.refresh_from_db()
        got = kinds(run)
        assert got["recovery"] == 1, (run.pk, got)
        assert got["tool_call_recovered"] == 1
        assert run.recovery_attempts == 1
        assert run.tool_calls.get().state == "requested"  # read_only: may run again
        assert run.lease_owner == ""
    acted = Counter(f.run_id for r in reports for f in r.findings if f.done)
    assert all(acted[str(run.pk)] == 1 for run in runs), acted
    assert executions("lookup") == []  # the reaper re-enqueues, it does not execute
    assert Counter(no_broker) == Counter({str(run.pk): 1 for run in runs})
    for run in runs:
        client = finish(run, script)
        assert run.state == "completed", (run.state, run.error_code)
        assert client.steps() == {1: 1}  # the recorded answer of step 0 is not asked again
        assert_projection_matches(run)
    assert len(executions("lookup")) == len(runs)


@pytest.mark.no_projection_check  # checked at the end; a failing run stops half-way
def test_two_reapers__second_reaper_in_the_commit_window_acts_once(
    postgres, monkeypatch, no_broker
):
    """Deterministic interleaving: reaper 2 runs in full while reaper 1 has committed its
    lease_expired batch and is about to start the first recovery."""
    from django_agentrun import reaper as recovery

    script = [reply(tool_use("lookup", {"query": "q"})), reply(text("ok"))]
    runs = [crashed_at(monkeypatch, "tool.before_handler", script) for _ in range(3)]
    no_broker.clear()
    original = recovery.settle_in_flight
    second: list[object] = []

    def first_recovery_runs_a_second_reaper(run_id, *args, **kwargs):
        if not second:
            second.append(None)
            holder = threading.Thread(target=lambda: (second.append(reap()), connection.close()))
            holder.start()
            holder.join(30)
        return original(run_id, *args, **kwargs)

    monkeypatch.setattr(recovery, "settle_in_flight", first_recovery_runs_a_second_reaper)
    reap()
    assert len(second) == 2  # the second reaper ran
    for run in runs:
        assert kinds(run)["recovery"] == 1, (run.pk, kinds(run))
    assert Counter(no_broker) == Counter({str(run.pk): 1 for run in runs})
    for run in runs:
        finish(run, script)
        assert_projection_matches(run)
        # The worker that claims the released run does not count the recovery again.
        assert kinds(run)["recovery"] == 1, (run.pk, kinds(run))


def test_two_reapers__past_deadline_timed_out_once(postgres):
    runs = [start_run("test-agent", "hello", deadline=timedelta(seconds=-1)) for _ in range(10)]
    two_reapers()
    for run in runs:
        run.refresh_from_db()
        assert run.state == "timed_out"
        assert kinds(run)["run_timed_out"] == 1
        assert_projection_matches(run)


# --------------------------------------------------------------------------- reconcile_runs


def _stuck_mix(monkeypatch):
    queued = stale_queued()
    # Died while asking the model: the turn is running, nothing recorded of the answer.
    crashed = crashed_at(monkeypatch, "model.before_commit", [reply(text("lost answer"))])
    late = start_run("test-agent", "hello", deadline=timedelta(seconds=-1))
    fine = start_run("test-agent", "hello")
    return queued, crashed, late, fine


def test_reconcile_runs__dry_run_prints_and_changes_nothing(postgres, monkeypatch, no_broker):
    queued, crashed, late, fine = _stuck_mix(monkeypatch)
    no_broker.clear()
    before = state_of_db()
    out = io.StringIO()
    call_command("reconcile_runs", "--dry-run", "--stale-after", "60", stdout=out)
    printed = out.getvalue()
    assert state_of_db() == before
    assert no_broker == []
    lines = printed.splitlines()
    assert any(str(queued.pk) in line and "not_picked_up" in line for line in lines), printed
    assert any(str(crashed.pk) in line and "lease_expired" in line for line in lines), printed
    assert any(str(late.pk) in line and "deadline" in line for line in lines), printed
    assert str(fine.pk) not in printed
    assert lines[-1].startswith("Would: ")
    assert "1 not_picked_up" in lines[-1] and "1 lease_expired" in lines[-1]


def test_reconcile_runs__acts_when_not_dry(postgres, monkeypatch):
    queued, crashed, late, fine = _stuck_mix(monkeypatch)
    out = io.StringIO()
    call_command("reconcile_runs", "--stale-after", "60", stdout=out)
    assert out.getvalue().splitlines()[-1].startswith("Did: ")
    late.refresh_from_db()
    assert late.state == "timed_out"
    assert kinds(queued)["reaper_requeued"] == 1
    assert kinds(crashed)["recovery"] == 1
    assert kinds(fine) == Counter({"run_created": 1})


def test_reconcile_runs__run_limits_it(postgres, monkeypatch):
    queued, crashed, late, fine = _stuck_mix(monkeypatch)
    before = state_of_db()
    out = io.StringIO()
    call_command("reconcile_runs", "--run", str(late.pk), stdout=out)
    late.refresh_from_db()
    assert late.state == "timed_out"
    assert str(queued.pk) not in out.getvalue() and str(crashed.pk) not in out.getvalue()
    for run in (queued, crashed, fine):
        assert [r for r in state_of_db()[0] if r["id"] == run.pk] == [
            r for r in before[0] if r["id"] == run.pk
        ]
        assert kinds(run) == Counter(
            RunEvent.objects.filter(run_id=run.pk).values_list("type", flat=True)
        )
    assert kinds(queued)["reaper_requeued"] == 0
    assert kinds(crashed)["recovery"] == 0


def test_reconcile_runs__run_repeatable_and_unknown_id(postgres, monkeypatch):
    queued, crashed, late, fine = _stuck_mix(monkeypatch)
    out = io.StringIO()
    call_command(
        "reconcile_runs",
        "--run",
        str(queued.pk),
        "--run",
        str(late.pk),
        "--stale-after",
        "60",
        stdout=out,
    )
    assert kinds(queued)["reaper_requeued"] == 1
    assert kinds(crashed)["recovery"] == 0
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"No run with id {missing}"):
        call_command("reconcile_runs", "--run", str(missing), stdout=io.StringIO())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stale-after", "soon"], "'soon' is not a number of seconds"),
        (["--stale-after", "-5"], "must not be negative"),
        (["--run", "not-a-uuid"], "is not a run id"),
    ],
)
def test_reconcile_runs__bad_arguments_error_clearly(postgres, args, message):
    run = stale_queued()
    before = state_of_db()
    with pytest.raises(CommandError, match=message):
        call_command("reconcile_runs", *args, stdout=io.StringIO())
    assert state_of_db() == before
    assert_projection_matches(run)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_reconcile_runs__stale_after_not_finite_refused(postgres, value):
    stale_queued()
    with pytest.raises(CommandError, match="seconds"):
        call_command("reconcile_runs", "--stale-after", value, stdout=io.StringIO())


# --------------------------------------------------------------------------- indexes


def _bulk_completed(n=5000):
    now = timezone.now()
    Run.objects.bulk_create(
        [
            Run(
                agent="test-agent",
                state="completed",
                input="x",
                queued_at=now - timedelta(days=2),
                lease_expires_at=now - timedelta(days=2),
                deadline=now - timedelta(days=1),
                last_seq=0,
                finished_at=now - timedelta(days=2),
            )
            for _ in range(n)
        ],
        batch_size=1000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agentrun_run")


def _plan(qs):
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.no_projection_check
def test_indexes__reaper_scans_use_their_partial_indexes(postgres):
    _bulk_completed()
    # A few rows of each kind the scans are after.
    stale_queued()
    late = start_run("test-agent", "hello", deadline=timedelta(seconds=-1))
    Run.objects.filter(pk=late.pk).update(queued_at=timezone.now())
    now = timezone.now()
    plans = {
        "agentrun_run_ph_leased_idx": _plan(Run.objects.lease_expired(now)),
        "agentrun_run_ph_queued_idx": _plan(Run.objects.queued_stale(now - timedelta(minutes=1))),
        "agentrun_run_ph_deadline_idx": _plan(Run.objects.past_deadline(now)),
    }
    for index, plan in plans.items():
        assert index in plan, f"{index} not used:\n{plan}"
        assert "Seq Scan" not in plan, plan


@pytest.mark.no_projection_check
def test_indexes__every_reaper_select_avoids_a_seq_scan_on_runs(postgres):
    """The queries reap() really sends (with its extra filters and the OR of two scans)."""
    _bulk_completed()
    stale_queued()
    with CaptureQueriesContext(connection) as ctx:
        reap(dry_run=True, stale_after=60)
    selects = [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].startswith("SELECT") and 'FROM "agentrun_run"' in q["sql"]
    ]
    assert len(selects) >= 4
    bad = {}
    for sql in selects:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        if "Seq Scan on agentrun_run" in plan:
            bad[sql] = plan
    assert not bad, "\n\n".join(f"{s}\n{p}" for s, p in bad.items())


# --------------------------------------------------------------------------- recovery outcomes


def test_deadline__past_deadline_without_live_lease_times_out(postgres, monkeypatch):
    crashed = crashed_at(
        monkeypatch,
        "tool.before_handler",
        [reply(tool_use("save_note", {"text": "x"})), reply(text("ok"))],
    )
    Run.objects.filter(pk=crashed.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    queued = start_run("test-agent", "hello", deadline=timedelta(seconds=-1))
    report = reap()
    assert {(f.run_id, f.kind) for f in report.findings if f.done} >= {
        (str(crashed.pk), "deadline"),
        (str(queued.pk), "deadline"),
    }
    for run in (crashed, queued):
        run.refresh_from_db()
        assert run.state == "timed_out"
        assert run.stop_reason == "timed_out"
        assert run.lease_owner == ""
        assert_projection_matches(run)
    call = crashed.tool_calls.get()
    assert call.state == "cancelled" and call.is_error
    assert "may have started" in call.result
    assert crashed.turns.get().state == "cancelled"
    assert executions("save_note") == []


def test_deadline__live_lease_is_left_to_its_worker(postgres):
    run = start_run("test-agent", "hello", deadline=timedelta(seconds=-1))
    Run.objects.filter(pk=run.pk).update(
        lease_owner="alive:1:x", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    report = reap()
    assert not [f for f in report.findings if f.run_id == str(run.pk)]
    run.refresh_from_db()
    assert run.state == "queued"


def test_dead_worker__non_idempotent_without_check_goes_to_a_person(postgres, monkeypatch):
    run = crashed_at(
        monkeypatch,
        "tool.before_handler",
        [
            reply(tool_use("charge_card", {"amount_cents": 500}, id="toolu_charge")),
            reply(text("x")),
        ],
    )
    call = run.tool_calls.get()
    assert call.state == "in_flight"
    report = reap()
    assert [(f.kind, f.done) for f in report.findings if f.run_id == str(run.pk)] == [
        ("lease_expired", True)
    ]
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.state == "awaiting_approval"
    assert call.state == "unknown"
    assert "no reconcile check" in call.unknown_reason
    assert run.lease_owner == ""
    assert executions("charge_card") == []
    # Reaping again changes nothing: a person decides now.
    seq = run.last_seq
    reap()
    run.refresh_from_db()
    assert run.last_seq == seq and run.state == "awaiting_approval"
    # A worker woken anyway does not run it either.
    assert advance(run.pk, client=ScriptedClient([])) == Outcome.NOT_CLAIMED
    assert executions("charge_card") == []
    assert_projection_matches(run)


def test_dead_worker__non_idempotent_with_check_reconciled(postgres, monkeypatch):
    run = crashed_at(
        monkeypatch,
        "tool.before_handler",
        [reply(tool_use("send_message", {"to": "a@b.c", "body": "hi"})), reply(text("x"))],
    )
    reap()
    run.refresh_from_db()
    call = run.tool_calls.get()
    # The check finds it was not sent (the handler never started): one new attempt allowed.
    assert call.state == "requested"
    assert kinds(run)["tool_call_recovered"] == 1
    assert run.state == "awaiting_tool"
    assert executions("send_message") == []
    finish(run, [reply(tool_use("send_message", {"to": "a@b.c", "body": "hi"})), reply(text("x"))])
    assert run.state == "completed"
    assert len(executions("send_message")) == 1
    call.refresh_from_db()
    assert call.state == "succeeded" and call.attempt == 2  # the crashed attempt was 1
    assert_projection_matches(run)
