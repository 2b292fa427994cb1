"""Migration 0019_run_phase on a million runs, with writers at work:
`python bench/migration.py [--runs N] [--writers W] [--keep]`.

Makes its own database (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/agentrun_migration_bench: dropped and made again unless
`--keep` finds it at 0018 with `--runs` runs), migrates it to 0018_run_cancelling_index,
and loads N runs with `generate_series` in SQL, rows as wide as a real run's: a 200-byte
input, a 1.6 KB config snapshot (a system prompt and tool schemas), metadata, a
correlation id, a trace context; 97 % finished over a year, the rest queued, running,
awaiting a tool or a person. (The migration touches no other table: no turns or events
are loaded.) Then VACUUM ANALYZE, as autovacuum would have.

Then `migrate agentrun 0019_run_phase`, timed step by step, while W writer threads (own
connections, autocommit) do what workers do to the table: a turn's commit on a random
active run (its state flipped between running and awaiting_tool, its lease and usage
moved on), a new run inserted now and then, a run read by its id; each statement's
latency is kept. A monitor polls pg_locks every 10 ms for a lock on agentrun_run that
blocks writes (SHARE and up) and for writers waiting on one. The figures: the
migration's total and per-step time, the writers' latency before (5 s alone) and during
it (median, p99, worst, and the worst per step), and the longest a blocking lock was seen
held. Finally every run's phase is checked against its state.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentrun_migration_bench"
BEFORE = "0018_run_cancelling_index"
TARGET = "0019_run_phase"

LOAD = """
INSERT INTO agentrun_run (
    id, agent, state, input, config, correlation_id, metadata, input_tokens,
    output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd,
    turn_count, stop_reason, error_code, error_message, failure_phase, cancel_reason,
    lease_owner, lease_expires_at, lease_epoch, recovery_attempts, last_seq, created_at,
    updated_at, queued_at, started_at, finished_at, deadline, context, rolled_back,
    request_hash, trace_context, share_key, idempotency_key)
SELECT md5('r' || g)::uuid, 'agent-' || floor(20 * r1 * r1)::int, st,
    to_jsonb('Please look into order ' || g || ': ' || repeat(md5(g::text), 5)),
    jsonb_build_object(
        'model', 'claude-sonnet-4-5', 'max_tokens', 4096,
        'system', 'You are a support agent. ' || repeat(md5('s' || (g %% 50)), 60),
        'tools', jsonb_build_array(
            jsonb_build_object('name', 'lookup_order', 'description', repeat('d', 200),
                'input_schema', jsonb_build_object('type', 'object')),
            jsonb_build_object('name', 'refund', 'description', repeat('e', 200),
                'input_schema', jsonb_build_object('type', 'object')))),
    md5('c' || g), jsonb_build_object('tenant', 't' || (g %% 300), 'source', 'web'),
    (1000 + r3 * 20000)::bigint, (200 + r3 * 2000)::bigint,
    CASE WHEN r4 < 0.3 THEN 2000 ELSE 0 END, (r4 * 30000)::bigint,
    round((0.001 + r3 * r3 * 0.5)::numeric, 6), 1 + floor(r5 * 8)::int,
    CASE WHEN fin THEN 'end_turn' ELSE '' END,
    CASE WHEN st = 'failed' THEN 'code_' || floor(12 * r5 * r5)::int ELSE '' END,
    CASE WHEN st = 'failed' THEN 'The model call failed for good.' ELSE '' END,
    '', '',
    CASE WHEN st IN ('running', 'awaiting_tool') THEN 'worker-' || (g %% 8) ELSE '' END,
    created + interval '30 seconds', 1, 0, 9 + floor(r5 * 30)::int,
    created, created, created, created + interval '2 seconds',
    CASE WHEN fin THEN created + (5 + r5 * 600) * interval '1 second' END,
    CASE WHEN r2 < 0.2 THEN created + interval '1 hour' END,
    '', false, md5('h' || g),
    jsonb_build_object('traceparent', '00-' || md5('t' || g) || '-' || left(md5('p' || g), 16)
        || '-01'),
    'tenant-' || (g %% 300), CASE WHEN r2 < 0.3 THEN 'key-' || g END
FROM (
    SELECT g, r1, r2, r3, r4, r5, created,
        CASE WHEN r6 < 0.005 THEN 'queued' WHEN r6 < 0.015 THEN 'running'
             WHEN r6 < 0.025 THEN 'awaiting_tool' WHEN r6 < 0.03 THEN 'awaiting_approval'
             WHEN r2 < 0.85 THEN 'completed' WHEN r2 < 0.93 THEN 'failed'
             WHEN r2 < 0.97 THEN 'cancelled' ELSE 'timed_out' END AS st,
        r6 >= 0.03 AS fin
    FROM (
        SELECT g, random() AS r1, random() AS r2, random() AS r3, random() AS r4,
               random() AS r5, random() AS r6,
               now() - (%(n)s - g) * (365 * interval '1 day' / %(n)s) AS created
        FROM generate_series(1, %(n)s) AS g
    ) AS s
) AS s
"""

# A turn's commit, as the write function does it to the run's row.
TURN = """
UPDATE agentrun_run SET
    state = CASE WHEN state = 'running' THEN 'awaiting_tool' ELSE 'running' END,
    lease_expires_at = statement_timestamp() + interval '30 seconds',
    input_tokens = input_tokens + 1000, output_tokens = output_tokens + 100,
    cost_usd = cost_usd + 0.001, turn_count = turn_count + 1, last_seq = last_seq + 3,
    updated_at = statement_timestamp()
WHERE id = %s AND state IN ('running', 'awaiting_tool')
"""
NEW_RUN = LOAD.replace("generate_series(1, %(n)s)", "generate_series(%(g)s::int, %(g)s::int)")
READ = "SELECT state, lease_owner, last_seq FROM agentrun_run WHERE id = %s"
BLOCKING = (
    "SELECT mode FROM pg_locks WHERE locktype = 'relation' "
    "AND relation = 'agentrun_run'::regclass AND granted "
    "AND mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')"
)
WAITING = (
    "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid IN "
    "(SELECT pid FROM pg_stat_activity WHERE datname = current_database())"
)


def _libpq(url: str) -> str:
    import re

    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


def _admin_connection(url: str):
    import dj_database_url
    import psycopg

    cfg = dj_database_url.parse(url)
    return cfg["NAME"], psycopg.connect(
        host=cfg.get("HOST") or "127.0.0.1",
        port=cfg.get("PORT") or 5432,
        user=cfg.get("USER") or "postgres",
        dbname="postgres",
        autocommit=True,
    )


def prepare(url: str, runs: int, keep: bool) -> None:
    """The database at 0018 holding `runs` runs."""
    import psycopg
    from psycopg import sql

    name, admin = _admin_connection(url)
    with admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists and keep:
            with psycopg.connect(_libpq(url), autocommit=True) as conn:
                applied = conn.execute(
                    "SELECT max(name) FROM django_migrations WHERE app = 'agentrun'"
                ).fetchone()[0]
                count = conn.execute("SELECT count(*) FROM agentrun_run").fetchone()[0]
            if applied == BEFORE and count == runs:
                print(f"  kept: {name} is at {BEFORE} with {runs:,} runs", flush=True)
                return
        if exists:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    from django.core.management import call_command
    from django.db import connection

    started = time.monotonic()
    for app in ("contenttypes", "auth"):  # whole, before 0018's own dependencies
        call_command("migrate", app, verbosity=0)
    call_command("migrate", "agentrun", BEFORE, verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(LOAD, {"n": runs})
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE agentrun_run")
        cursor.execute(
            "SELECT pg_total_relation_size('agentrun_run'), pg_relation_size('agentrun_run')"
        )
        total, heap = cursor.fetchone()
    connection.close()
    print(
        f"  loaded {runs:,} runs at {BEFORE} in {time.monotonic() - started:.0f} s "
        f"(agentrun_run: {heap / 2**20:,.0f} MB heap, {total / 2**20:,.0f} MB with TOAST and "
        "indexes)",
        flush=True,
    )


class Writers:
    """Processes doing a worker's statements on the table (processes, not threads: the
    migration's own Python in this process must not hold them up), each latency kept with
    its wall-clock time."""

    def __init__(self, url: str, count: int, runs: int) -> None:
        import subprocess

        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--writer", str(i), "--runs", str(runs)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "DATABASE_URL": url},
            )
            for i in range(count)
        ]
        self.samples: list[tuple[float, float, str]] = []  # (start, seconds, kind)
        self.errors: list[str] = []

    def finish(self) -> None:
        for proc in self.procs:
            out, _ = proc.communicate("stop\n", timeout=60)
            for line in out.splitlines():
                kind, a, b = line.split("\t", 2)
                if kind == "error":
                    self.errors.append(b)
                else:
                    self.samples.append((float(a), float(b), kind))

    def latencies(self, lo: float = 0.0, hi: float = float("inf")) -> list[float]:
        return [s for t, s, _k in self.samples if lo <= t < hi]


def writer(url: str, i: int, runs: int) -> None:
    """One writer process: statements until a line comes on stdin; then its samples."""
    import select

    import psycopg

    rng = random.Random(i)
    out: list[str] = []
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        active = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM agentrun_run WHERE state IN ('running', 'awaiting_tool')"
            )
        ]
        serial = itertools.count(runs + 1 + i * 10_000_000)
        while not select.select([sys.stdin], [], [], 0)[0]:
            roll = rng.random()
            started = time.time()
            clock = time.perf_counter()
            try:
                if roll < 0.7:
                    kind = "turn"
                    conn.execute(TURN, [rng.choice(active)])
                elif roll < 0.75:
                    kind = "insert"
                    conn.execute(NEW_RUN, {"n": runs, "g": next(serial)})
                else:
                    kind = "read"
                    conn.execute(READ, [rng.choice(active)]).fetchall()
            except psycopg.Error as exc:
                out.append(f"error\t{started}\t{type(exc).__name__}: {str(exc)[:150]!r}")
                continue
            out.append(f"{kind}\t{started}\t{time.perf_counter() - clock}")
            time.sleep(0.002)
    sys.stdout.write("\n".join(out) + "\n")


class Monitor(threading.Thread):
    """Polls pg_locks: how long a lock that blocks writes was seen held, writers waiting."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.stop = threading.Event()
        self.longest = 0.0
        self.longest_mode = ""
        self.max_waiting = 0

    def run(self) -> None:
        import psycopg

        held_since: float | None = None
        mode = ""
        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            while not self.stop.is_set():
                now = time.perf_counter()
                modes = [row[0] for row in conn.execute(BLOCKING)]
                self.max_waiting = max(self.max_waiting, conn.execute(WAITING).fetchone()[0])
                if modes:
                    if held_since is None:
                        held_since, mode = now, ",".join(sorted(set(modes)))
                    if now - held_since > self.longest:
                        self.longest, self.longest_mode = now - held_since, mode
                else:
                    held_since = None
                time.sleep(0.01)


def timed_steps() -> list[tuple[str, float, float]]:
    """Wrap each operation of the migration to keep (description, start, end)."""
    module = importlib.import_module(f"django_agentrun.migrations.{TARGET}")
    steps: list[tuple[str, float, float]] = []
    for op in module.Migration.operations:
        forwards = op.database_forwards

        def timed(*args, _op=op, _forwards=forwards, **kwargs):
            started = time.time()
            try:
                return _forwards(*args, **kwargs)
            finally:
                steps.append((_op.describe(), started, time.time()))

        op.database_forwards = timed
    return steps


def _ms(values: list[float], q: float | None = None) -> str:
    if not values:
        return "-"
    if q is None:
        return f"{max(values) * 1000:,.1f}"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=2, help="writer threads (default 2)")
    parser.add_argument("--keep", action="store_true", help="reuse a loaded database")
    parser.add_argument("--writer", type=int, help=argparse.SUPPRESS)  # a writer process
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if args.writer is not None:
        writer(url, args.writer, args.runs)
        return 0
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    print(f"== Migration {TARGET} on {args.runs:,} runs, {args.writers} writers ==", flush=True)
    prepare(url, args.runs, args.keep)
    writers = Writers(url, args.writers, args.runs)
    monitor = Monitor(url)
    monitor.start()
    time.sleep(6)  # the writers start, then work 5 s alone
    alone_until = time.time()
    steps = timed_steps()
    started = time.time()
    try:
        call_command("migrate", "agentrun", TARGET, verbosity=0)
    finally:
        ended = time.time()
        time.sleep(1)
        writers.finish()
        monitor.stop.set()
        monitor.join()
    before = writers.latencies(alone_until - 5, alone_until)
    during = writers.latencies(started, ended)
    print(f"  migration: {ended - started:.1f} s in all", flush=True)
    print(f"  {'step':70s} {'s':>7s} {'writers worst ms':>17s}")
    for name, lo, hi in steps:
        print(f"  {name[:70]:70s} {hi - lo:7.1f} {_ms(writers.latencies(lo, hi)):>17s}")
    print(
        f"  writers alone (5 s): {len(before):,} statements, median {_ms(before, 0.5)} ms, "
        f"p99 {_ms(before, 0.99)} ms, worst {_ms(before)} ms"
    )
    print(
        f"  writers during the migration: {len(during):,} statements, median "
        f"{_ms(during, 0.5)} ms, p99 {_ms(during, 0.99)} ms, worst {_ms(during)} ms"
        + (f"; {len(writers.errors)} errors: {writers.errors[:3]}" if writers.errors else "")
    )
    print(
        f"  longest lock blocking writes seen held (polled every 10 ms): "
        f"{monitor.longest * 1000:,.0f} ms ({monitor.longest_mode or 'none'}); most "
        f"statements waiting on a lock at once: {monitor.max_waiting}"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE phase IS NULL), count(*) FILTER (WHERE phase IS "
            "DISTINCT FROM CASE state WHEN 'queued' THEN 'queued' WHEN 'running' THEN 'leased' "
            "WHEN 'awaiting_tool' THEN 'leased' WHEN 'awaiting_approval' THEN 'parked' "
            "ELSE 'finished' END), count(*) FROM agentrun_run"
        )
        nulls, wrong, total = cursor.fetchone()
    print(f"  after: {total:,} runs, {nulls} without a phase, {wrong} with a wrong one")
    print(f"  (mean {statistics.mean(during) * 1000 if during else 0:.2f} ms during)")
    return 1 if nulls or wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
