"""Load: 1,000 runs at once through 2 prefork workers x 2 processes, a 3 s lease and the
reaper every second (`make bench-load`; `BENCH_HOG=2` adds two busy loops at nice -5, a
machine saturated by something else).

Each run is the throughput scenario (tool, tool, answer: 3 turns). Every model answer and
every tool execution is logged by the workers (BENCH_CALLS_LOG); the bench prints the runs
completed, the model steps and tool calls executed more than once (a step paid twice), the
reaper's actions by kind, the leases the heartbeat took back and how late it woke, and
turns/s (first run created to last run finished, database timestamps).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from .common import check, figure, section, table, wait_until
from .workers import LOG_DIR, Reaper, Workers

NAME = "load"
AGENT = "bench-throughput"
TURNS = 3
LEASE = 3
PREVIOUS_TURNS_PER_S = 49.0  # v0.4.0, quiet machine (issue #26)
HOG = "while 1: pass"


class CountingReaper(Reaper):
    """The bench's beat: reap() every `interval` seconds, counting what each pass did. It
    looks at the bench's runs from the moment they are committed (the runs of the load's
    agent created since it started), not from when `_start` returns: publishing a thousand
    wake-ups after the commit takes a while on a busy machine, and a reaper that only
    learned the ids afterwards never saw that window (issue #35)."""

    def __init__(self, interval: float, since) -> None:
        super().__init__(interval, set())
        self.since = since
        self.actions: Counter[str] = Counter()
        self.passes = 0

    def run(self) -> None:
        from django.db import connection

        from django_agentrun.models import Run
        from django_agentrun.recovery import reap

        ours = Run.objects.filter(agent=AGENT, created_at__gte=self.since).values_list(
            "pk", flat=True
        )
        try:
            while not self._halt.wait(self.interval):
                try:
                    report = reap(run_ids=list(ours.all()))  # a fresh read each pass
                    self.passes += 1
                    self.actions.update(f.kind for f in report.findings)
                except Exception as exc:  # noqa: BLE001 - keep reaping
                    self.errors.append(repr(exc))
        finally:
            connection.close()


def _hogs(n: int) -> list[subprocess.Popen]:
    """`n` busy loops 5 steps of niceness above the workers (nice -5 beside workers at 0),
    where this process may (root); else at the workers' own."""
    nice = ["nice", "-n", "-5"] if os.geteuid() == 0 else ["nice", "-n", "0"]
    return [subprocess.Popen([*nice, sys.executable, "-c", HOG]) for _ in range(n)]


def _start(n: int) -> list:
    """`n` runs at once: created in one transaction, their wake-ups published on its commit."""
    from django.db import transaction

    from django_agentrun import start_run

    with transaction.atomic():
        return [start_run(AGENT, f"load id=load-{i}").pk for i in range(n)]


def measure(n: int, hogs: int) -> dict:
    from django.conf import settings
    from django.utils import timezone

    from django_agentrun.models import Run, RunEvent, ToolCall

    calls_log = LOG_DIR / f"load-calls-{hogs}.log"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    calls_log.unlink(missing_ok=True)
    env = {"AGENTRUN_LEASE_SECONDS": str(LEASE), "BENCH_CALLS_LOG": str(calls_log)}
    pool = Workers(f"load{hogs}", **env)
    old_lease = getattr(settings, "AGENTRUN_LEASE_SECONDS", None)
    settings.AGENTRUN_LEASE_SECONDS = LEASE
    os.environ["BENCH_CALLS_LOG"] = str(calls_log)
    busy: list[subprocess.Popen] = []
    try:
        with pool.active():
            workers = [pool.start(pool="prefork", concurrency=2) for _ in range(2)]
            busy = _hogs(hogs)
            time.sleep(1 if hogs else 0)
            ids: set = set()
            reaper = CountingReaper(1.0, timezone.now())
            reaper.start()
            started = time.monotonic()
            ids.update(_start(n))
            created_s = time.monotonic() - started

            def done() -> bool:
                return Run.objects.filter(pk__in=ids, finished_at__isnull=False).count() == n

            finished = wait_until(done, timeout=600, interval=0.5)
            wall = time.monotonic() - started
            reaper.stop()
            logs = "\n".join(w.log_text() for w in workers)
    finally:
        for hog in busy:
            hog.kill()
            hog.wait()
        settings.AGENTRUN_LEASE_SECONDS = old_lease
        os.environ.pop("BENCH_CALLS_LOG", None)
    rows = list(Run.objects.filter(pk__in=ids).values_list("state", "created_at", "finished_at"))
    states = Counter(r[0] for r in rows)
    ends = [r[2] for r in rows if r[2] is not None]
    elapsed = (max(ends) - min(r[1] for r in rows)).total_seconds() if ends else float("nan")
    lines = Path(calls_log).read_text().splitlines() if Path(calls_log).exists() else []
    seen = Counter(lines)
    models = sum(1 for k in seen if k.startswith("model "))
    return {
        "runs": n,
        "hogs": hogs,
        "finished": bool(finished),
        "completed": states.get("completed", 0),
        "states": dict(states),
        "created_s": created_s,
        "wall": wall,
        "elapsed": elapsed,
        "turns_per_s": n * TURNS / elapsed,
        "model_steps": models,
        "model_twice": sum(1 for k, c in seen.items() if k.startswith("model ") and c > 1),
        "tools": sum(1 for k in seen if k.startswith("tool ")),
        "tool_twice": sum(1 for k, c in seen.items() if k.startswith("tool ") and c > 1),
        "reaper_passes": reaper.passes,
        "reaper_actions": dict(reaper.actions),
        "reaper_errors": reaper.errors[:3],
        "recovery_events": RunEvent.objects.filter(run__in=ids, type="recovery").count(),
        "rerun_calls": ToolCall.objects.filter(run__in=ids, attempt__gt=1).count(),
        "taken_back": logs.count("taken back"),
        "late_tasks": logs.count("Heartbeat late"),
        "max_late": max(
            (float(x) for x in re.findall(r"late by up to ([0-9.]+)s", logs)), default=0
        ),
        "self_ended": logs.count("ending the process"),
    }


def run(quick: bool) -> None:
    hogs = int(os.environ.get("BENCH_HOG", "0"))
    n = int(os.environ.get("BENCH_LOAD_RUNS", "100" if quick else "1000"))
    mine = os.nice(0)
    above = mine - 5 if os.geteuid() == 0 else mine
    section(
        f"Load: {n} runs at once, 2 prefork workers x 2 processes (nice {mine}), lease "
        f"{LEASE} s, reaper every 1 s{f', {hogs} busy loops at nice {above}' if hogs else ''}"
    )
    r = measure(n, hogs)
    actions = sum(r["reaper_actions"].values())
    print(
        table(
            ["figure", "value"],
            [
                ["runs completed", f"{r['completed']} / {r['runs']} {r['states']}"],
                ["runs created (s)", round(r["created_s"], 1)],
                ["first created -> last finished (s)", round(r["elapsed"], 1)],
                ["turns/s", round(r["turns_per_s"], 1)],
                ["model steps answered / asked twice", f"{r['model_steps']} / {r['model_twice']}"],
                ["tool calls executed / executed twice", f"{r['tools']} / {r['tool_twice']}"],
                ["tool calls with attempt > 1", r["rerun_calls"]],
                [
                    "reaper passes / actions",
                    f"{r['reaper_passes']} / {actions} {r['reaper_actions']}",
                ],
                ["recovery events", r["recovery_events"]],
                ["leases taken back", r["taken_back"]],
                [
                    "tasks whose heartbeat woke late / max late (s)",
                    f"{r['late_tasks']} / {r['max_late']:.2f}",
                ],
                ["processes that ended themselves", r["self_ended"]],
            ],
        )
    )
    if r["reaper_errors"]:
        print(f"  reaper errors: {r['reaper_errors']}")
    label = f"{'hog x' + str(hogs) if hogs else 'quiet'}"
    figure(NAME, f"turns/s ({label})", f"{r['turns_per_s']:.1f}")
    check(NAME, f"all runs complete ({label})", r["completed"] == n, f"{r['completed']}/{n}")
    twice = r["model_twice"] + r["tool_twice"]
    check(NAME, f"every step and tool once ({label})", twice == 0, f"{twice} twice")
    check(NAME, f"0 reaper actions ({label})", actions == 0, str(actions))
    check(
        NAME,
        f"turns/s >= previous release's {PREVIOUS_TURNS_PER_S:g} ({label})",
        r["turns_per_s"] >= PREVIOUS_TURNS_PER_S,
        f"{r['turns_per_s']:.1f}",
    )
