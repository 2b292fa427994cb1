"""The governor check (issue #26): the account's rate limit honoured by every worker
together, and a fair share per owner.

`python bench/governor.py [--quick]` (make bench-governor). The stand-in Messages API
limits the account to RATE requests a second as the API does (429 with retry-after and
anthropic-ratelimit-* headers: testing/messages_api/ratelimit.py); owner A starts A_RUNS
runs, owner B B_RUNS runs two seconds later; each run asks the model twice (a tool call,
then its answer), through the real SDK client; 2 prefork workers x 2 processes (real
Celery workers on Redis), the reaper every second, a 3 s lease. Prints: runs completed,
model steps answered once (none paid twice), 429s / answered (target <= 10%), the batch's
time / the time the limit allows (target <= 1.5x), B's slowest run / A's batch time
(target <= 0.25).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("AGENTRUN_LEASE_SECONDS", "3")
os.environ.setdefault("AGENTRUN_QUEUED_STALE_SECONDS", "3")

from bench import common  # noqa: E402

NAME = "governor"
REQUESTS_PER_RUN = 2


class Reaper(threading.Thread):
    """Beat's reaper, every `interval` seconds, on the bench's runs; counts its actions."""

    def __init__(self, interval: float, run_ids: set) -> None:
        super().__init__(name="governor-reaper", daemon=True)
        self.interval, self.run_ids = interval, run_ids
        self.actions: Counter[str] = Counter()
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from django_agentrun.reaper import reap

        try:
            while not self._halt.wait(self.interval):
                try:
                    if self.run_ids:
                        report = reap(run_ids=list(self.run_ids))
                        self.actions.update(f.kind for f in report.findings if f.done)
                except Exception as exc:  # noqa: BLE001 - keep reaping
                    self.errors.append(repr(exc))
        finally:
            connection.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def _owner(name: str):
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username=f"bench-governor-{name}")
    return user


def measure(a_runs: int, b_runs: int, rate: float, b_after: float = 2.0) -> dict:
    from bench.workers import Workers
    from django_agentrun import start_run
    from django_agentrun.models import Run
    from django_agentrun.testing.messages_api import (
        AccountLimit,
        MessagesAPIServer,
        Reply,
        by_step,
        tool_use,
    )

    owner_a, owner_b = _owner("a"), _owner("b")
    script = by_step([Reply([tool_use("lookup", {"query": "q"})]), Reply("done")])
    limit = AccountLimit(rate)
    ids: set = set()
    with MessagesAPIServer(script, rate_limit=limit) as server:
        pool = Workers(
            "governor",
            AGENTRUN_MODEL_CLIENT="django_agentrun.clients.anthropic.AnthropicModelClient",
            ANTHROPIC_BASE_URL=server.base_url,
            ANTHROPIC_API_KEY="bench-key",
            AGENTRUN_LEASE_SECONDS="3",
            AGENTRUN_QUEUED_STALE_SECONDS="3",
            AGENTRUN_LOG_LEVEL="WARNING",
        )
        with pool.active():
            pool.start(pool="prefork", concurrency=2)
            pool.start(pool="prefork", concurrency=2)
            reaper = Reaper(1.0, ids)
            reaper.start()
            started = time.monotonic()
            a_ids = [start_run("bench-governor", f"a{i}", owner=owner_a).pk for i in range(a_runs)]
            ids.update(a_ids)
            time.sleep(max(0.0, started + b_after - time.monotonic()))
            b_ids = [start_run("bench-governor", f"b{i}", owner=owner_b).pk for i in range(b_runs)]
            ids.update(b_ids)
            finished = common.wait_until(
                lambda: (
                    Run.objects.filter(pk__in=ids, finished_at__isnull=False).count() == len(ids)
                ),
                timeout=60 + 4 * (a_runs + b_runs) * REQUESTS_PER_RUN / rate,
                interval=0.1,
            )
            reaper.stop()
        requests = server.requests
    rows = {
        r[0]: r[1:]
        for r in Run.objects.filter(pk__in=ids).values_list(
            "pk", "state", "created_at", "finished_at", "turn_count"
        )
    }
    answered: Counter = Counter()
    refused = 0
    for record in requests:
        body = record.get("body") or {}
        messages = body.get("messages") or []
        who = messages[0]["content"] if messages else "?"
        step = sum(1 for m in messages if m.get("role") == "assistant")
        if record.get("status") == 200:
            answered[(str(who), step)] += 1
        elif record.get("status") == 429:
            refused += 1
    done = [r for r in rows.values() if r[0] == "completed"]
    a_rows = [rows[i] for i in a_ids if rows[i][2] is not None]
    b_rows = [rows[i] for i in b_ids if rows[i][2] is not None]
    end = max((r[2] for r in rows.values() if r[2] is not None), default=None)
    first = min(r[1] for r in rows.values())
    a_batch = (max(r[2] for r in a_rows) - min(r[1] for r in a_rows)).total_seconds()
    b_slowest = max((r[2] - r[1]).total_seconds() for r in b_rows) if b_rows else float("nan")
    n_answered = sum(answered.values())
    return {
        "finished": bool(finished),
        "runs": len(rows),
        "completed": len(done),
        "steps": len(answered),
        "paid_twice": sum(1 for n in answered.values() if n > 1),
        "answered": n_answered,
        "refused": refused,
        "batch": (end - first).total_seconds() if end else float("nan"),
        "allowed": max(0.0, n_answered - limit.capacity) / rate,
        "a_batch": a_batch,
        "b_slowest": b_slowest,
        "reaper": dict(reaper.actions),
        "reaper_errors": reaper.errors[:3],
        "logs": "" if finished else pool.logs(),
    }


def run(quick: bool) -> dict:
    a_runs, b_runs, rate = (40, 4, 5.0) if quick else (120, 4, 5.0)
    common.section(
        f"Governor check: {a_runs} + {b_runs} runs, the account limited to {rate:g} requests/s, "
        "2 workers x 2 processes, lease 3 s, reaper every 1 s"
    )
    r = measure(a_runs, b_runs, rate)
    if not r["finished"]:
        print(r["logs"][-3000:])
    print(
        f"  runs completed: {r['completed']} / {r['runs']}; model steps answered: "
        f"{r['steps']}, paid twice: {r['paid_twice']}; reaper actions: {r['reaper'] or 0}"
    )
    ratio_429 = r["refused"] / max(1, r["answered"])
    ratio_time = r["batch"] / r["allowed"] if r["allowed"] else float("nan")
    ratio_b = r["b_slowest"] / r["a_batch"]
    print(
        f"  429s: {r['refused']} for {r['answered']} answered; batch {r['batch']:.1f} s, "
        f"the limit allows {r['allowed']:.1f} s; B's slowest run {r['b_slowest']:.1f} s, "
        f"A's batch {r['a_batch']:.1f} s"
    )
    common.check(NAME, "every run completes", r["completed"] == r["runs"], f"{r['completed']}")
    common.check(NAME, "0 model steps paid twice", r["paid_twice"] == 0, f"{r['paid_twice']}")
    common.check(NAME, "429s / answered <= 10%", ratio_429 <= 0.10, f"{ratio_429:.1%}")
    common.check(NAME, "batch / allowed <= 1.5x", ratio_time <= 1.5, f"{ratio_time:.2f}x")
    common.check(NAME, "B's slowest / A's batch <= 0.25", ratio_b <= 0.25, f"{ratio_b:.2f}")
    return r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 + 4 runs instead of 120 + 4")
    args = parser.parse_args(argv)
    db_name = common.setup_django()
    common.reset_tables(db_name)
    run(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
