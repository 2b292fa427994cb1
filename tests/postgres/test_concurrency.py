"""Races on Postgres with real connections: threads, each with its own database connection,
released together by a Barrier. Exactly one writer wins each race, the others get a clean
exception (or None for a claim), and event seqs stay unique and gap-free."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection

from django_agentrun import cancel_run, resume_run, start_run, store, transitions
from django_agentrun.engine import Outcome, advance
from django_agentrun.exceptions import (
    ConcurrentUpdate,
    InvalidTransition,
    LeaseLost,
    RunNotActive,
)
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.states import RunState
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import assert_projection_matches, drive
from tests.factories import expire, failed_run


def claim_lease(run_id, owner):
    """Only the claim (no history): the lease, or None."""
    claimed = store.claim(run_id, owner, history=False)
    return claimed.lease if claimed else None


pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Nothing here needs a worker: record the wake-ups instead of sending them."""


def race(n, target):
    """Run `target(i)` in n threads released at once; returns (results, errors) by
    thread. Each thread uses (and closes) its own database connection."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(i):
        try:
            barrier.wait(timeout=10)
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a racing thread hung (a deadlock?)"
    return results, errors


def seqs(run):
    return list(
        RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("seq", flat=True)
    )


def assert_gap_free(run):
    run.refresh_from_db()
    found = seqs(run)
    assert found == list(range(1, len(found) + 1))
    assert run.last_seq == len(found)


# --------------------------------------------------------------------------- one transition


def test_race__two_resume_run_one_wins(postgres):
    for _ in range(5):
        run = failed_run()
        results, errors = race(2, lambda i, pk=run.pk: resume_run(pk))
        won = [r for r in results if r is not None]
        lost = [e for e in errors if e is not None]
        assert len(won) == 1 and len(lost) == 1, (results, errors)
        assert isinstance(lost[0], InvalidTransition)
        assert "cannot go from 'queued'" in str(lost[0])
        run.refresh_from_db()
        assert run.state == "queued"
        types = list(run.events.values_list("type", flat=True))
        assert types.count("run_resumed") == 1
        assert_gap_free(run)
        assert_projection_matches(run)


def test_race__eight_resume_run_one_wins(postgres):
    run = failed_run()
    results, errors = race(8, lambda i: resume_run(run.pk))
    assert sum(r is not None for r in results) == 1
    assert all(isinstance(e, InvalidTransition) for e in errors if e is not None)
    assert sum(e is not None for e in errors) == 7
    assert list(run.events.values_list("type", flat=True)).count("run_resumed") == 1
    assert_gap_free(run)
    assert_projection_matches(run)


def test_race__two_cancel_run_cancel_once(postgres):
    for _ in range(5):
        run = start_run("test-agent", "hello")
        results, errors = race(2, lambda i, pk=run.pk: cancel_run(pk, reason=f"by {i}"))
        assert errors == [None, None], errors  # the second sees it cancelled: a no-op
        run.refresh_from_db()
        assert run.state == "cancelled"
        kinds = Counter(run.events.values_list("type", flat=True))
        assert kinds["run_cancelled"] == 1
        assert kinds["cancel_requested"] == 1
        assert_gap_free(run)
        assert_projection_matches(run)


def test_race__cancel_against_resume(postgres):
    """A cancelled run: one thread resumes, one cancels again. Either order is consistent."""
    for _ in range(5):
        run = start_run("test-agent", "hello")
        cancel_run(run)

        def act(i, pk=run.pk):
            return resume_run(pk) if i == 0 else cancel_run(pk)

        results, errors = race(2, act)
        assert all(e is None or isinstance(e, InvalidTransition) for e in errors), errors
        assert_gap_free(run)
        assert_projection_matches(run)


def test_race__cas_write_same_transition_one_wins(postgres):
    """A write's compare-and-set on the state, without any row lock taken first."""
    run = start_run("test-agent", "hello")

    def cancel_by_cas(i):
        mine = Run.objects.get(pk=run.pk)  # both load 'queued'
        write = store.Write(mine)
        transitions.stop_run(write, mine, RunState.CANCELLED, f"t{i}", calls=[])
        time.sleep(0.05)
        store.send(write)
        return i

    results, errors = race(2, cancel_by_cas)
    assert sum(r is not None for r in results) == 1
    (lost,) = [e for e in errors if e is not None]
    assert isinstance(lost, ConcurrentUpdate)
    assert "expected state 'queued', found 'cancelled'" in str(lost)
    assert list(run.events.values_list("type", flat=True)) == ["run_created", "run_cancelled"]
    assert_gap_free(run)
    assert_projection_matches(run)


# --------------------------------------------------------------------------- claims


def test_race__two_claims_one_lease(postgres):
    run = start_run("test-agent", "hello")
    epochs = []
    for _ in range(20):
        results, errors = race(2, lambda i: claim_lease(run.pk, f"worker-{i}"))
        assert errors == [None, None], errors
        leases = [r for r in results if r is not None]
        assert len(leases) == 1, results
        (lease,) = leases
        run.refresh_from_db()
        assert run.lease_owner == lease.owner and run.lease_epoch == lease.epoch
        epochs.append(lease.epoch)
        store.release_lease(lease)
    assert epochs == list(range(1, 21))  # one bump per race, never two
    run.refresh_from_db()
    assert run.recovery_attempts == 0  # released leases are not crashes


def test_race__eight_claims_one_lease(postgres):
    run = start_run("test-agent", "hello")
    results, errors = race(8, lambda i: claim_lease(run.pk, f"worker-{i}"))
    assert errors == [None] * 8
    assert sum(r is not None for r in results) == 1


def test_race__two_advance_one_model_call(postgres):
    """Duplicate delivery in-process: two advance() at once, the model is asked once."""
    client = ScriptedClient(
        [reply(text("slow"), tool_use("lookup", {"query": "q"})), reply(text("ok"))]
    )
    run = start_run("test-agent", "hello")
    results, errors = race(2, lambda i: advance(run.pk, client=client, owner=f"worker-{i}"))
    assert errors == [None, None], errors
    assert sorted(results) == sorted([Outcome.FINISHED, Outcome.NOT_CLAIMED])
    assert client.steps() == {0: 1, 1: 1}
    assert ToolCall.objects.filter(run=run).count() == 1
    assert_gap_free(run)
    assert_projection_matches(run)


# --------------------------------------------------------------------------- many writers


def test_many_writers__cancel_resume_cycles_keep_seq_gap_free(postgres):
    run = start_run("test-agent", "hello")

    def cycle(i):
        done = Counter()
        for _ in range(6):
            for action in (cancel_run, resume_run):
                try:
                    action(run.pk)
                    done[action.__name__] += 1
                except (InvalidTransition, RunNotActive):
                    done["refused"] += 1
        return done

    results, errors = race(8, cycle)
    assert errors == [None] * 8, errors
    assert_gap_free(run)
    kinds = Counter(run.events.values_list("type", flat=True))
    assert kinds["run_cancelled"] >= 1
    # Each resume follows a cancel: the counts alternate, whatever the interleaving.
    assert kinds["run_cancelled"] - kinds["run_resumed"] in (0, 1)
    assert_projection_matches(run)


def test_many_writers__write_run_batches_keep_seq_gap_free(postgres):
    run = start_run("test-agent", "hello")
    per_thread, rounds = 8, 10

    def append(i):
        mine = Run.objects.get(pk=run.pk)
        for r in range(rounds):
            write = store.Write(mine)
            for k in range(1 + (i + r) % 3):
                write.record(("note", {"thread": i, "round": r, "k": k}))
            store.send(write)
        return i

    results, errors = race(per_thread, append)
    assert errors == [None] * per_thread, errors
    expected = 1 + sum(1 + (i + r) % 3 for i in range(per_thread) for r in range(rounds))
    assert_gap_free(run)
    assert run.last_seq == expected
    # A batch is contiguous: its events got consecutive seqs in one statement.
    notes = list(run.events.filter(type="note").order_by("seq").values_list("seq", "payload"))
    batches: dict[tuple[int, int], list[int]] = {}
    for seq, payload in notes:
        batches.setdefault((payload["thread"], payload["round"]), []).append(seq)
    for found in batches.values():
        assert found == list(range(found[0], found[0] + len(found)))


def test_many_writers__concurrent_start_run_same_idempotency_key(postgres):
    results, errors = race(
        6, lambda i: start_run("test-agent", "hello", idempotency_key="same-key").pk
    )
    assert errors == [None] * 6, errors
    assert len(set(results)) == 1
    assert Run.objects.filter(idempotency_key="same-key").count() == 1
    run = Run.objects.get()
    assert list(run.events.values_list("seq", "type")) == [(1, "run_created")]


# --------------------------------------------------------------------------- zombies


def test_zombie__superseded_lease_writes_nothing(postgres):
    run = start_run("test-agent", "hello")
    old = claim_lease(run.pk, "zombie")
    assert old is not None
    assert claim_lease(run.pk, "thief") is None  # live lease: refused
    expire(run, ago=timedelta(seconds=5))
    new = claim_lease(run.pk, "thief")
    assert new is not None and new.epoch == old.epoch + 1
    run.refresh_from_db()
    assert run.recovery_attempts == 1  # the zombie never released it
    before = (run.last_seq, seqs(run), run.state, run.updated_at)

    mine = Run.objects.get(pk=run.pk)
    write = store.Write(mine, old)
    write.record(("note", {"by": "zombie"}))
    write.set_run(stop_reason="zombie")
    with pytest.raises(LeaseLost, match=f"epoch {old.epoch} was superseded"):
        store.send(write)
    mine = Run.objects.get(pk=run.pk)
    write = store.Write(mine, old)
    transitions.begin_run(write, mine, "zombie")
    with pytest.raises(LeaseLost):
        store.send(write)
    # Renewing and releasing with the old lease do nothing either.
    assert store.renew_lease(old) == (False, False)
    store.release_lease(old)
    run.refresh_from_db()
    assert (run.last_seq, seqs(run), run.state, run.updated_at) == before
    assert run.lease_owner == "thief" and run.lease_epoch == new.epoch
    assert run.stop_reason == ""
    # The new holder can write.
    write = store.Write(Run.objects.get(pk=run.pk), new)
    write.record(("note", {"by": "thief"}))
    store.send(write)
    assert_gap_free(run)


def _steal_mid_step(run, client, reached):
    """Advance the run as "zombie" in a thread; once `reached()` holds, expire its lease
    and claim it as "thief". Returns the thief's lease after the zombie's step ended,
    which must have been LEASE_LOST."""
    outcome: list[str] = []

    def zombie():
        try:
            outcome.append(advance(run.pk, client=client, owner="zombie"))
        finally:
            connection.close()

    thread = threading.Thread(target=zombie)
    thread.start()
    deadline = time.monotonic() + 10
    while not reached():
        assert time.monotonic() < deadline, "the zombie never got there"
        time.sleep(0.02)
    expire(run, ago=timedelta(seconds=5))
    thief = claim_lease(run.pk, "thief")
    assert thief is not None
    thread.join(20)
    assert outcome == [Outcome.LEASE_LOST]
    return thief


def _finish_after(thief, run, client):
    """The thief gives the lease back; the run then finishes."""
    store.release_lease(thief)
    close_old_connections()
    drive(run, client, limit=5)
    assert run.state == "completed", (run.state, run.error_code, run.error_message)
    assert_projection_matches(run)


def test_zombie__engine_step_that_lost_its_lease_records_nothing(postgres):
    """A worker stuck in the model call loses its lease; its answer is refused."""
    entered = threading.Event()

    class Gate(ScriptedClient):
        def create(self, request, *, abort):
            entered.set()
            time.sleep(0.5)  # meanwhile the lease expires and someone else claims it
            return super().create(request, abort=abort)

    client = Gate([reply(tool_use("save_note", {"text": "x"})), reply(text("ok"))])
    run = start_run("test-agent", "hello")
    thief = _steal_mid_step(run, client, entered.is_set)
    run.refresh_from_db()
    assert run.lease_owner == "thief"
    types = list(run.events.values_list("type", flat=True))
    assert "model_response" not in types
    assert ToolCall.objects.filter(run=run).count() == 0
    assert run.turn_count == 0 and run.output_tokens == 0
    assert_gap_free(run)

    _finish_after(thief, run, client)  # the answer is recorded once
    assert list(run.events.values_list("type", flat=True)).count("model_response") == 2
    assert run.turn_count == 2


def test_zombie__tool_result_of_a_lost_lease_is_kept_on_its_call(postgres):
    """A worker whose lease was taken while its handler ran: its step's write is refused,
    and the result the tool returned is recorded on the call, still in flight in that
    attempt (the new holder, settling it, would read it again); nothing runs twice."""
    client = ScriptedClient([reply(tool_use("slow", {"seconds": 0.6})), reply(text("done"))])
    run = start_run("test-agent", "hello")
    in_flight = ToolCall.objects.filter(run=run, state="in_flight").exists
    thief = _steal_mid_step(run, client, in_flight)
    call = ToolCall.objects.get(run=run)
    assert (call.state, call.result, call.attempt) == ("succeeded", "slept", 1)
    assert call.result_source == "executed"
    finished = run.events.filter(type="tool_call_finished").get()
    assert finished.payload["late"] is True
    assert_gap_free(run)

    _finish_after(thief, run, client)
    call.refresh_from_db()
    assert (call.state, call.attempt) == ("succeeded", 1)  # not run again


def test_cap__claims_racing_under_one_cap_take_its_slots_only(postgres, settings):
    """AGENTRUN_MAX_RUNS_PER_KEY on many workers at once: the claims under one cap count
    one after the other (the cap's lock, held to the end of each claim's transaction), so
    no two see the same free slot."""
    from django_agentrun.abort import AbortSignal
    from django_agentrun.engine.claim import Capped, claim
    from django_agentrun.engine.step import Step
    from tests.factories import user

    settings.AGENTRUN_MAX_RUNS_PER_KEY = 2
    ann = user("ann")
    runs = [start_run("test-agent", f"r{i}", owner=ann) for i in range(8)]

    def target(i):
        step = Step(runs[i].pk, f"worker-{i}", AbortSignal(), None)
        found = claim(step)
        return found is not None and not isinstance(found, Capped)

    results, errors = race(len(runs), target)
    assert errors == [None] * len(runs)
    assert sum(results) == 2
    worked = Run.objects.filter(pk__in=[r.pk for r in runs], state=RunState.RUNNING)
    assert worked.exclude(lease_owner="").count() == 2
    assert Run.objects.filter(state=RunState.QUEUED, lease_epoch=0).count() == 6
