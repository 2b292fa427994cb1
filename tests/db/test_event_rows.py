"""One RunEventRow per commit, read one event per seq through RunEvent (the view): a write
stores one row whatever its number of events, rows are gap-free, RunEvent.objects.create()
and bulk_create() add rows, and migration 0013 converts the events both ways."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_agentrun import start_run, store
from django_agentrun.models import Run, RunEvent, RunEventRow
from django_agentrun.models.events import ID_SPAN

pytestmark = pytest.mark.django_db

BEFORE = ("agentrun", "0012_pooler_write_function")


def _events(run) -> list[tuple[int, str, dict]]:
    return list(
        RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type", "payload")
    )


def _rows(run) -> list[tuple[int, int, int]]:
    return [
        (row.seq, row.seq_to, len(row.events))
        for row in RunEventRow.objects.filter(run=run).order_by("seq")
    ]


def test_write__one_row_per_commit_read_one_event_per_seq():
    run = start_run("test-agent", "x")
    write = store.Write(Run.objects.get(pk=run.pk))
    for n in range(3):
        write.record(("note", {"n": n}))
    store.send(write)
    write = store.Write(Run.objects.get(pk=run.pk))
    write.record(("note", {"n": 3}))
    store.send(write)
    assert _rows(run) == [(1, 1, 1), (2, 4, 3), (5, 5, 1)]
    assert [e[:2] for e in _events(run)] == [
        (1, "run_created"),
        (2, "note"),
        (3, "note"),
        (4, "note"),
        (5, "note"),
    ]
    assert [e[2] for e in _events(run)[1:]] == [{"n": n} for n in range(4)]
    # Filtered by seq and type, and read by id, as one row per event was.
    assert list(
        RunEvent.objects.filter(run=run, seq__gt=2, seq__lte=4).values_list("seq", flat=True)
    ) == [3, 4]
    assert RunEvent.objects.filter(run=run, type="note").count() == 4
    row = RunEventRow.objects.get(run=run, seq=2)
    assert RunEvent.objects.get(pk=row.pk * ID_SPAN + 1).seq == 3
    assert Run.objects.get(pk=run.pk).last_seq == 5


@pytest.mark.no_projection_check  # rows added by hand: the run's last_seq stays
def test_bulk_create__consecutive_seqs_share_a_row():
    run = start_run("test-agent", "x")
    made = RunEvent.objects.bulk_create(
        [RunEvent(run=run, seq=seq, type="copied", payload={"seq": seq}) for seq in (2, 3, 4, 6)]
    )
    assert _rows(run) == [(1, 1, 1), (2, 4, 3), (6, 6, 1)]
    assert [RunEvent.objects.get(pk=e.pk).seq for e in made] == [2, 3, 4, 6]
    one = RunEvent.objects.create(run=run, seq=7, type="single", payload={})
    assert RunEvent.objects.get(pk=one.pk).type == "single"


@pytest.mark.no_projection_check
@pytest.mark.django_db(transaction=True)
def test_migration__converts_events_both_ways():
    run = start_run("test-agent", "x")
    executor = MigrationExecutor(connection)
    leaf = executor.loader.graph.leaf_nodes("agentrun")
    try:
        executor.migrate([BEFORE])
        executor = MigrationExecutor(connection)
        Old = executor.loader.project_state([BEFORE]).apps.get_model("agentrun", "RunEvent")
        assert list(Old.objects.filter(run_id=run.pk).values_list("seq", "type")) == [
            (1, "run_created")
        ]
        now = timezone.now()
        # Two commits (seqs 2-3 at one time, 4 at another): two rows.
        Old.objects.bulk_create(
            [
                Old(run_id=run.pk, seq=2, type="a", payload={"x": "\u00e9"}, created_at=now),
                Old(run_id=run.pk, seq=3, type="b", payload={"y": [1]}, created_at=now),
                Old(run_id=run.pk, seq=4, type="c", payload={}, created_at=now + timedelta(1)),
            ]
        )
        before = list(
            Old.objects.filter(run_id=run.pk)
            .order_by("seq")
            .values_list("seq", "type", "payload", "created_at")
        )
        executor.migrate(leaf)
        assert _rows(run) == [(1, 1, 1), (2, 3, 2), (4, 4, 1)]
        after = list(
            RunEvent.objects.filter(run=run)
            .order_by("seq")
            .values_list("seq", "type", "payload", "created_at")
        )
        assert after == before
        executor = MigrationExecutor(connection)
        executor.migrate([BEFORE])
        executor = MigrationExecutor(connection)
        Old = executor.loader.project_state([BEFORE]).apps.get_model("agentrun", "RunEvent")
        again = list(
            Old.objects.filter(run_id=run.pk)
            .order_by("seq")
            .values_list("seq", "type", "payload", "created_at")
        )
        assert again == before
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaf)
