"""3. Recovery latency after the whole worker is SIGKILLed mid-turn.

Two solo workers consume the section's queue, with AGENTRUN_LEASE_SECONDS=3; the
bench process runs the reaper (`recovery.reap()`, limited to this section's runs)
every second, as celery beat would. Each trial starts a run whose tool hangs on
its first attempt, waits until the call is `in_flight` (plus a random 0.2-1.5 s,
so the kill lands anywhere in the heartbeat's renewal cycle), SIGKILLs the
holder's whole process group, and reads from the run's events how long it took
until the reaper recovered it, until a worker resumed it (the re-run's
`tool_call_started`) and until it completed. Then a replacement worker starts.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

from .common import check, figure, median, section, table, wait_until
from .workers import Reaper, Workers

NAME = "recovery"
LEASE_SECONDS = 3.0
REAPER_INTERVAL = 1.0


def _holder(run_id) -> str:
    from django_agentrun.models import Run

    return Run.objects.filter(pk=run_id).values_list("lease_owner", flat=True).first() or ""


def trial(pool: Workers, reaper: Reaper, index: int) -> dict:
    from django_agentrun import start_run
    from django_agentrun.models import Run, RunEvent, ToolCall

    run = start_run("bench-recovery", f"recover id=rec-{index}")
    reaper.run_ids.add(run.pk)
    if not wait_until(
        lambda: ToolCall.objects.filter(run_id=run.pk, state="in_flight").exists(), timeout=30
    ):
        raise RuntimeError(f"recovery: the tool never started\n{pool.logs()}")
    time.sleep(random.uniform(0.2, 1.5))
    holder = _holder(run.pk)
    pid = int(holder.split(":")[1])
    victim = next((w for w in pool.workers if w.alive() and pid in w.pids()), None)
    if victim is None:
        raise RuntimeError(f"recovery: no live worker holds the lease ({holder})")
    expires = Run.objects.filter(pk=run.pk).values_list("lease_expires_at", flat=True).first()
    last_seq = Run.objects.filter(pk=run.pk).values_list("last_seq", flat=True).first()
    killed_at = datetime.now(UTC)
    pool.kill(victim)
    if not wait_until(
        lambda: Run.objects.filter(pk=run.pk, state="completed").exists(), timeout=60, interval=0.02
    ):
        state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
        raise RuntimeError(
            f"recovery: run not completed 60 s after the kill ({state})\n{pool.logs()}"
        )
    events = list(
        RunEvent.objects.filter(run_id=run.pk, seq__gt=last_seq)
        .order_by("seq")
        .values_list("type", "payload", "created_at")
    )

    def since(predicate) -> float:
        at = next(e[2] for e in events if predicate(e))
        return (at - killed_at).total_seconds()

    result = {
        "lease_left": (expires - killed_at).total_seconds(),
        "first_event": since(lambda e: True),
        "resumed": since(lambda e: e[0] == "tool_call_started"),
        "completed": since(lambda e: e[0] == "run_completed"),
        "first_type": events[0][0],
    }
    pool.start()  # the replacement (a supervisor would restart it)
    return result


def run(quick: bool) -> None:
    section("3. Recovery after SIGKILL of a whole worker (lease 3 s, reaper every 1 s)")
    trials = 2 if quick else 5
    bound = LEASE_SECONDS + REAPER_INTERVAL
    pool = Workers("recovery", AGENTRUN_LEASE_SECONDS=str(LEASE_SECONDS))
    results = []
    from django.conf import settings

    old_lease = getattr(settings, "AGENTRUN_LEASE_SECONDS", None)
    settings.AGENTRUN_LEASE_SECONDS = LEASE_SECONDS  # the reaper's own claim
    reaper = Reaper(REAPER_INTERVAL, set())
    try:
        with pool.active():
            pool.start()
            pool.start()
            reaper.start()
            for i in range(trials):
                results.append(trial(pool, reaper, i))
    finally:
        reaper.stop()
        if old_lease is None:
            del settings.AGENTRUN_LEASE_SECONDS
        else:
            settings.AGENTRUN_LEASE_SECONDS = old_lease
    rows = [
        [
            i + 1,
            r["lease_left"],
            r["first_type"],
            r["first_event"],
            r["first_event"] - r["lease_left"],
            r["resumed"],
            r["completed"],
        ]
        for i, r in enumerate(results)
    ]
    print(
        table(
            [
                "trial",
                "lease left at kill s",
                "first event after kill",
                "recovered s",
                "after expiry s",
                "resumed s",
                "completed s",
            ],
            rows,
        )
    )
    resumed = [r["resumed"] for r in results]
    completed = [r["completed"] for r in results]
    print(
        f"  kill -> resumed by the other worker: median {median(resumed):.2f} s, worst "
        f"{max(resumed):.2f} s; bound lease + reaper interval = {bound:.1f} s"
    )
    print(
        f"  kill -> run completed: median {median(completed):.2f} s, worst {max(completed):.2f} s"
    )
    if reaper.errors:
        print(f"  reaper errors: {reaper.errors[:3]}")
    check(
        NAME,
        "recovery within lease + reaper interval",
        max(resumed) <= bound,
        f"worst {max(resumed):.2f} s, median {median(resumed):.2f} s (bound {bound:.1f} s)",
    )
    figure(
        NAME, "kill -> resumed (median / worst)", f"{median(resumed):.2f} / {max(resumed):.2f} s"
    )
    figure(
        NAME,
        "kill -> completed (median / worst)",
        f"{median(completed):.2f} / {max(completed):.2f} s",
    )
