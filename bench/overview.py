"""The admin overview's queries on 1,000,000 runs: `python bench/overview.py [--runs N]
[--days D] [--rebuild] [--repeat R]`.

Loads its own database once (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/agentrun_overview_bench; kept between invocations: the
load is skipped when it already holds `--runs` runs, `--rebuild` loads it again) with
`generate_series` in SQL: N runs created evenly over the last D days (default 365: a
year of history), each finished a few minutes after it started (the last 500 still
active) in a final state (85 % completed, 8 % failed with one of 12 codes, 4 % cancelled,
3 % timed out), 20 agents (skewed), usage and cost; 3 turns a run (3 models), 2 tool calls
a run (15 tools) with skewed durations; 1,000 calls waiting for a person. Then VACUUM
ANALYZE, as autovacuum would have done on a database that old.

Then, for each window (24 h, 7 d, 30 d) and each query of `admin/overview_data.py`, as a
user who sees every run: the median of `--repeat` timings (after one warm-up) of the
query as the page runs it (Python included), the server's execution time and the plan's
summary (scans and the indexes they use) from EXPLAIN (ANALYZE, BUFFERS). Target: each
query under 200 ms. Prints PASS/MISS per query; exit 0 either way. The machine's pace in
the same run is printed as a reference (a median of 100,000 random numbers in Postgres),
and each query's time as a multiple of it, to compare runs on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentrun_overview_bench"
TARGET_MS = 200.0

# One statement per table; :n runs over :days days, ids derived from the run's number so
# turns and calls find their run (and calls their turn) without a join.
LOAD = [
    """
    INSERT INTO agentrun_run (
        id, agent, state, input, config, correlation_id, metadata, input_tokens,
        output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd,
        turn_count, stop_reason, error_code, error_message, failure_phase, cancel_reason,
        lease_owner, lease_epoch, recovery_attempts, last_seq, created_at, updated_at,
        queued_at, started_at, finished_at, context, rolled_back, request_hash,
        trace_context, share_key)
    SELECT md5('r' || g)::uuid, 'agent-' || floor(20 * r1 * r1)::int,
        CASE WHEN g > %(n)s - 500 THEN 'queued' WHEN r2 < 0.85 THEN 'completed'
             WHEN r2 < 0.93 THEN 'failed' WHEN r2 < 0.97 THEN 'cancelled' ELSE 'timed_out' END,
        '"a task"', '{}', '', '{}', (1000 + r3 * 20000)::bigint, (200 + r3 * 2000)::bigint,
        CASE WHEN r4 < 0.3 THEN 2000 ELSE 0 END, (r4 * 30000)::bigint,
        round((0.001 + r3 * r3 * 0.5)::numeric, 6), 3, 'end_turn',
        CASE WHEN g <= %(n)s - 500 AND r2 >= 0.85 AND r2 < 0.93
             THEN 'code_' || floor(12 * r5 * r5)::int ELSE '' END,
        '', '', '', '', 1, 0, 9, created, created, created, created + interval '2 seconds',
        CASE WHEN g > %(n)s - 500 THEN NULL
             ELSE created + (5 + r5 * 600) * interval '1 second' END, '', false, '', '{}', ''
    FROM (
        SELECT g, random() AS r1, random() AS r2, random() AS r3, random() AS r4,
               random() AS r5,
               now() - (%(n)s - g) * (%(days)s * interval '1 day' / %(n)s) AS created
        FROM generate_series(1, %(n)s) AS g
    ) AS s
    """,
    """
    INSERT INTO agentrun_turn (
        id, index, state, is_final, message_id, request_id, model, stop_reason, input_tokens,
        output_tokens, cache_creation_input_tokens, cache_read_input_tokens, model_attempts,
        started_at, finished_at, run_id, usage_details, prefix)
    SELECT g * 3 + k, k, CASE WHEN g > %(n)s - 500 THEN 'running'
                              WHEN random() < 0.97 THEN 'completed' ELSE 'failed' END,
        false, '', '', 'claude-model-' || (g + k) %% 3, 'end_turn', 1000, 200, 0, 0, 1,
        r.created_at + (2 + 60 * k) * interval '1 second',
        CASE WHEN g > %(n)s - 500 THEN NULL
             ELSE r.created_at + (2 + 60 * k + 0.5 + 30 * power(random(), 3))
                  * interval '1 second' END,
        r.id, '{}', ''
    FROM generate_series(1, %(n)s) AS g
    CROSS JOIN generate_series(0, 2) AS k
    JOIN agentrun_run AS r ON r.id = md5('r' || g)::uuid
    """,
    """
    INSERT INTO agentrun_toolcall (
        id, turn_index, tool_call_id, position, name, arguments, arguments_hash, side_effect,
        idempotency_key, state, attempt, started_at, finished_at, is_error, result_source,
        unknown_reason, approved, decision_note, created_at, run_id, turn_id, result_format)
    SELECT g * 2 + k, k, 'toolu_' || g || '_' || k, 0, 'tool-' || floor(15 * r1 * r1)::int,
        '{}', '', 'read_only', '',
        CASE WHEN g > %(n)s - 500 THEN 'awaiting_approval' ELSE 'succeeded' END,
        CASE WHEN g > %(n)s - 500 THEN 0 ELSE 1 END,
        CASE WHEN g > %(n)s - 500 THEN NULL ELSE t.started_at + interval '1 second' END,
        CASE WHEN g > %(n)s - 500 THEN NULL
             ELSE t.started_at + (1 + 20 * r2 * r2) * interval '1 second' END,
        false, 'executed', '', false, '', t.started_at, t.run_id, t.id, 'json'
    FROM (SELECT g, k, random() AS r1, random() AS r2
          FROM generate_series(1, %(n)s) AS g CROSS JOIN generate_series(0, 1) AS k) AS s
    JOIN agentrun_turn AS t ON t.id = g * 3 + k
    """,
]


def load(n: int, days: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM agentrun_run")
        if cursor.fetchone()[0] == n:
            print(f"  the database holds {n:,} runs: load skipped (--rebuild loads again)")
            return
        started = time.monotonic()
        cursor.execute(
            "TRUNCATE agentrun_runeventrow, agentrun_toolcall, agentrun_turn, agentrun_run CASCADE"
        )
        for statement in LOAD:
            cursor.execute(statement, {"n": n, "days": days})
            print(
                f"  loaded {cursor.rowcount:,} rows ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        for table in ("agentrun_turn", "agentrun_toolcall"):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "  # noqa: S608
                f"(SELECT max(id) FROM {table}))"
            )
    connection.close()
    with connection.cursor() as cursor:  # VACUUM runs outside a transaction (autocommit)
        cursor.execute("VACUUM ANALYZE agentrun_run, agentrun_turn, agentrun_toolcall")
    print(f"  load and VACUUM ANALYZE: {time.monotonic() - started:.0f} s", flush=True)


def _plan_summary(node: dict[str, Any], out: list[str]) -> list[str]:
    kind = node["Node Type"]
    if "Scan" in kind:
        target = node.get("Index Name") or node.get("Relation Name") or ""
        out.append(f"{kind} {target}".strip())
    for child in node.get("Plans", []):
        _plan_summary(child, out)
    return out


def explain(sql: str, params: Any) -> tuple[float, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    scans = _plan_summary(plan[0]["Plan"], [])
    return float(plan[0]["Execution Time"]), "; ".join(dict.fromkeys(scans))


def measure(repeat: int) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from django_agentrun.admin import overview_data as data
    from django_agentrun.models import Run

    runs = Run.objects.all()  # a user who sees every run
    queries = {
        "runs by state": lambda w: data.runs_by_state(runs, w),
        "cost per day": lambda w: data.cost_by_day(runs, w),
        "turn latency": lambda w: data.turn_latency(runs, w),
        "tool latency": lambda w: data.tool_latency(runs, w),
        "cache share": lambda w: data.cache_share(runs, w),
        "waiting calls": lambda w: data.waiting(runs, w.now),
        "failure codes": lambda w: data.failure_codes(runs, w),
    }
    # The machine's pace in this run (it is shared: compare the figures with this one):
    # Postgres sorting 100,000 random numbers for a median.
    with connection.cursor() as cursor:
        paces = []
        for _ in range(repeat):
            started = time.perf_counter()
            cursor.execute(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY random()) "
                "FROM generate_series(1, 100000)"
            )
            paces.append((time.perf_counter() - started) * 1000)
    pace = common.median(paces)
    print(f"  reference: a median of 100,000 random numbers in Postgres takes {pace:.1f} ms")
    rows = []
    for key in data.WINDOWS:
        w = data.window(key, timezone.now())
        for name, query in queries.items():
            query(w)  # warm-up
            timings = []
            for _ in range(repeat):
                started = time.perf_counter()
                with CaptureQueriesContext(connection) as captured:
                    query(w)
                timings.append((time.perf_counter() - started) * 1000)
            ms = common.median(timings)
            server, scans = [], []
            for q in captured.captured_queries:
                # CaptureQueriesContext keeps the SQL with its values in; EXPLAIN it as is.
                server_ms, scan = explain(q["sql"], None)
                server.append(server_ms)
                scans.append(scan)
            rows.append(
                [
                    key,
                    name,
                    f"{ms:.1f}",
                    f"{ms / pace:.2f}",
                    f"{max(server):.1f}",
                    " | ".join(scans),
                ]
            )
            common.check(
                "overview",
                f"{key} {name}",
                ms < TARGET_MS,
                f"{ms:.1f} ms (server {max(server):.1f} ms, {len(server)} statements)",
            )
    print()
    print(common.table(["window", "query", "ms", "x reference", "server ms", "plan"], rows))
    print(f"  (latency: p50/p95 over the window's latest {data.LATENCY_SAMPLE:,} rows)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs (default 1,000,000)")
    parser.add_argument("--days", type=int, default=365, help="days they span (default 365)")
    parser.add_argument("--repeat", type=int, default=5, help="timings per query (default 5)")
    parser.add_argument("--rebuild", action="store_true", help="load the database again")
    args = parser.parse_args(argv)
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    db_name = common.setup_django()
    if "bench" not in db_name:
        raise SystemExit(f"refusing to load {db_name}: its name must contain 'bench'")
    common.section(f"The admin overview's queries ({args.runs:,} runs over {args.days} days)")
    if args.rebuild:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE agentrun_run CASCADE")
    load(args.runs, args.days)
    measure(args.repeat)
    misses = [c for c in common.CHECKS if c.passed is False]
    print(
        f"\n{len(common.CHECKS) - len(misses)} of {len(common.CHECKS)} queries under "
        f"{TARGET_MS:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
