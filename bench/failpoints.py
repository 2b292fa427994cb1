"""4. Recovery after a crash at every failpoint, the wake-up window included.

For each failpoint of a run (django_agentrun.failpoints.RUN_POINTS, plus the second call of a
turn's shared commit), a solo worker started with AGENTRUN_FAILPOINTS=<point>=crash runs a
two-call turn and dies there (os._exit: no cleanup, no ack). As soon as its exit is seen,
a replacement worker starts (its start time is measured), while the bench process reaps
every second as celery beat would (lease 3 s). The figure is crash -> run completed
(the rest of the run is instant: a scripted model and instant tools). The bound is lease
+ reaper interval + that one worker start: a crash holding the lease waits for its
expiry; a crash after the lease was released (`turn.before_enqueue`, a lost wake-up)
waits for the stale threshold (at most the lease) while the queue is empty.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from .common import check, figure, median, section, table, wait_until
from .workers import Reaper, Workers

NAME = "failpoints"
LEASE_SECONDS = 3.0
REAPER_INTERVAL = 1.0
SECOND_CALL = ["tool.after_commit@lookup", "tool.before_handler@fetch_page"]


def _points(quick: bool) -> list[str]:
    from django_agentrun.failpoints import RUN_POINTS

    return sorted(RUN_POINTS) + ([] if quick else SECOND_CALL)


def trial(pool: Workers, reaper: Reaper, point: str, index: int) -> dict:
    from django_agentrun import start_run
    from django_agentrun.models import Run, RunEvent

    doomed = pool.start(AGENTRUN_FAILPOINTS=f"{point}=crash")
    run = start_run("bench-failpoints", f"crash id=fp-{index}")
    reaper.run_ids.add(run.pk)
    if not wait_until(lambda: not doomed.alive(), timeout=30, interval=0.005):
        raise RuntimeError(f"failpoints: {point} never fired\n{pool.logs()}")
    crashed = time.monotonic()
    crashed_at = datetime.now(UTC)
    pool.start()
    worker_start = time.monotonic() - crashed
    if not wait_until(
        lambda: Run.objects.filter(pk=run.pk, state="completed").exists(), timeout=60, interval=0.02
    ):
        state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
        raise RuntimeError(
            f"failpoints: {point}: not completed 60 s after ({state})\n{pool.logs()}"
        )
    finished = (
        RunEvent.objects.filter(run_id=run.pk, type="run_completed")
        .values_list("created_at", flat=True)
        .get()
    )
    recovered = RunEvent.objects.filter(run_id=run.pk, type="recovery").exists()
    pool.stop_all()
    pool.workers.clear()
    return {
        "point": point,
        "worker_start": worker_start,
        "completed": (finished - crashed_at).total_seconds(),
        "how": "lease expired" if recovered else "wake-up re-sent or redelivered",
    }


def run(quick: bool) -> None:
    section(
        "4. Recovery after a crash at every failpoint (lease 3 s, reaper every 1 s, "
        "one worker start)"
    )
    pool = Workers(NAME, AGENTRUN_LEASE_SECONDS=str(LEASE_SECONDS))
    from django.conf import settings

    old = getattr(settings, "AGENTRUN_LEASE_SECONDS", None)
    settings.AGENTRUN_LEASE_SECONDS = LEASE_SECONDS  # the reaper's judgement of staleness
    reaper = Reaper(REAPER_INTERVAL, set())
    results = []
    try:
        with pool.active():
            reaper.start()
            for i, point in enumerate(_points(quick)):
                results.append(trial(pool, reaper, point, i))
    finally:
        reaper.stop()
        if old is None:
            del settings.AGENTRUN_LEASE_SECONDS
        else:
            settings.AGENTRUN_LEASE_SECONDS = old
    bound = LEASE_SECONDS + REAPER_INTERVAL
    rows = [
        [
            r["point"],
            r["how"],
            r["worker_start"],
            r["completed"],
            bound + r["worker_start"],
        ]
        for r in results
    ]
    print(
        table(
            ["crash at", "recovered by", "worker start s", "crash -> completed s", "bound s"],
            rows,
        )
    )
    margins = [bound + r["worker_start"] - r["completed"] for r in results]
    worst = min(results, key=lambda r: bound + r["worker_start"] - r["completed"])
    if reaper.errors:
        print(f"  reaper errors: {reaper.errors[:3]}")
    check(
        NAME,
        "every failpoint recovered within lease + reaper interval + one worker start",
        min(margins) >= 0,
        f"worst {worst['point']}: {worst['completed']:.2f} s of "
        f"{bound + worst['worker_start']:.2f} s",
    )
    figure(
        NAME,
        "crash -> completed (median / worst)",
        f"{median([r['completed'] for r in results]):.2f} / "
        f"{max(r['completed'] for r in results):.2f} s",
    )
