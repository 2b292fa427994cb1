"""2. Throughput through real Celery workers on Redis: one prefork worker with two
pool processes (`--pool=prefork --concurrency=2`), N runs of 3 turns each
(tool, tool, answer) with the zero-latency bench client in the workers.

Each turn is one `advance_run` task: claim, model, tools, commit, enqueue the next
on commit. Elapsed time is from the first run's creation to the last run's
finish (database timestamps), after a warm-up run.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from .common import figure, median, pct, section, table, wait_until
from .workers import Workers

NAME = "throughput"
TURNS = 3


def _batch(n: int, tag: str) -> tuple[list, float]:
    from django_agentrun import start_run
    from django_agentrun.models import Run

    runs = [start_run("bench-throughput", f"{tag} id={tag}-{i}") for i in range(n)]
    ids = [r.pk for r in runs]

    def done() -> bool:
        return Run.objects.filter(pk__in=ids, finished_at__isnull=False).count() == n

    if not wait_until(done, timeout=120, interval=0.05):
        states = list(Run.objects.filter(pk__in=ids).values_list("state", flat=True))
        raise RuntimeError(f"throughput: runs not finished after 120 s: {states}")
    rows = list(
        Run.objects.filter(pk__in=ids).values_list(
            "state", "turn_count", "created_at", "finished_at"
        )
    )
    bad = [r[:2] for r in rows if r[:2] != ("completed", TURNS)]
    if bad:
        raise RuntimeError(f"throughput: {len(bad)} runs did not complete as scripted: {bad[:3]}")
    start = min(r[2] for r in rows)
    end = max(r[3] for r in rows)
    latencies = [(r[3] - r[2]).total_seconds() for r in rows]
    return latencies, (end - start).total_seconds()


def _task_times(log: Path, skip: int) -> list[float]:
    """Seconds of each advance_run task, from the worker log ("succeeded in Xs")."""
    found = re.findall(
        r"advance_run\[[^\]]+\] succeeded in ([0-9.]+)s", log.read_text(errors="replace")
    )
    return [float(x) for x in found][skip:]


def measure(n: int, conn_max_age: str) -> dict:
    pool = Workers(f"tp{conn_max_age}", BENCH_CONN_MAX_AGE=conn_max_age)
    with pool.active():
        worker = pool.start(pool="prefork", concurrency=2)
        _batch(4, f"warm{conn_max_age}")  # imports, connections, pool children
        latencies, elapsed = _batch(n, f"tp{conn_max_age}")
    tasks = _task_times(worker.log, skip=4 * TURNS)
    return {
        "task_median": median(tasks),
        "task_p90": pct(tasks, 90),
        "conn_max_age": conn_max_age,
        "runs": n,
        "elapsed": elapsed,
        "turns_per_s": n * TURNS / elapsed,
        "runs_per_s": n / elapsed,
        "latency_median": median(latencies),
        "latency_p90": pct(latencies, 90),
    }


def run(quick: bool) -> None:
    section("2. Throughput: real Celery workers on Redis (prefork, 2 processes)")
    n = 20 if quick else 50
    settings = ["0"] if quick else ["0", "60"]
    results = []
    for conn_max_age in settings:
        started = time.monotonic()
        results.append(measure(n, conn_max_age))
        results[-1]["wall"] = time.monotonic() - started
    rows = [
        [
            f"CONN_MAX_AGE={r['conn_max_age']}"
            + (" (example project)" if r["conn_max_age"] == "0" else ""),
            r["runs"],
            r["runs"] * TURNS,
            r["elapsed"],
            r["turns_per_s"],
            r["runs_per_s"],
            r["latency_median"] * 1000,
            r["task_median"] * 1000,
            r["task_p90"] * 1000,
        ]
        for r in results
    ]
    print(
        table(
            [
                "database connections",
                "runs",
                "turns",
                "elapsed s",
                "turns/s",
                "runs/s",
                "run latency ms",
                "task ms",
                "task p90 ms",
            ],
            rows,
        )
    )
    print(
        "  (each turn is one advance_run task; run latency = created -> completed, 3 turns, all runs\n"
        "   queued at once; task ms = a task's run time in the pool process, from the worker log;\n"
        "   CONN_MAX_AGE=0 makes Celery's Django fixup close the connection around every task)"
    )
    for r in results:
        figure(
            NAME,
            f"turns/s, 2 processes, CONN_MAX_AGE={r['conn_max_age']}",
            f"{r['turns_per_s']:.1f}",
        )
