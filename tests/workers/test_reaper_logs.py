"""The reaper runs every few seconds: a worker's log shows its passes only when they did
something (Celery's own received/succeeded lines of idle passes are dropped)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

from django.utils import timezone

from django_agentrun.models import Run, RunEvent
from django_agentrun.services import start_run
from django_agentrun.tasks import advance_run, reap
from tests.conftest import purge_queue
from tests.processes import wait_for


def _log(worker) -> str:
    return worker.log_path.read_text(errors="replace")


def test_reaper__idle_passes_leave_no_info_lines(workers, queue, settings):
    worker = workers.start()
    wait_for(lambda: " ready." in _log(worker), timeout=30, message="the worker")
    for _ in range(3):
        reap.apply_async(queue=queue)
    run = start_run("test-agent", "hello")
    wait_for(lambda: Run.objects.get(pk=run.pk).state != "queued", timeout=30, message="claimed")
    # One more idle pass, then a run whose wake-up was lost: that pass acts.
    reap.apply_async(queue=queue)
    # Its wake-up is never published (purging it after the fact raced an idle worker, which
    # could take it first).
    with mock.patch.object(advance_run, "apply_async"):
        lost = start_run("test-agent", "lost")
    purge_queue(queue)
    Run.objects.filter(pk=lost.pk).update(queued_at=timezone.now() - timedelta(minutes=5))
    reap.apply_async(queue=queue)
    wait_for(
        lambda: RunEvent.objects.filter(run=lost, type="reaper_requeued").exists(),
        timeout=30,
        message="the acting pass",
    )
    wait_for(lambda: "Task django_agentrun.reap[" in _log(worker), timeout=10, message="its line")
    lines = [line for line in _log(worker).splitlines() if "Task django_agentrun.reap[" in line]
    assert len(lines) == 1, lines  # the acting pass's "succeeded" line only
    assert "not_picked_up" in lines[0]
    assert f"Reaper not_picked_up run_id={lost.pk}" in _log(worker)
