"""1. The engine per turn, in-process: zero-latency scripted model, heartbeat off,
read_only tools that return at once, the next turn's dispatch stubbed out (no broker).

Each `advance` here does one turn (AGENTRUN_TURNS_PER_TASK = 1), so a turn's figures
include its task's claim: k + 2 commits. A task going on with its turns (the default) costs
k + 1 a turn; bench/side_by_side.py measures that steady state against DBOS and LangGraph.

Each run has `measured + 2` turns: turn 0 (queued -> running) and the final
end_turn answer are reported apart; turns 1..measured are the measured ones
(k tool calls each; k = 0 is a `pause_turn` reply: the same path without tools).
Runs alternate between timed (no instrumentation) and counted (statement and
COMMIT counters installed), so the counters do not slow the timed turns. The
floor (one single-row INSERT + COMMIT on the same connection) is sampled between
runs, so engine and floor see the same machine load.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from .common import SQLCounter, check, figure, median, pct, section, table

NAME = "engine"
KS = (0, 1, 4)
TARGET_MARGINAL_MS = 1.2
TARGET_FLOOR_FACTOR = 4.0

FLOOR_SQL = "INSERT INTO bench_floor (payload) VALUES (%s)"


def _stub_dispatch() -> tuple[Any, list[int]]:
    """Replace advance_run.apply_async (the broker publish after each turn's commit)."""
    import django_agentrun.tasks  # noqa: F401 - registers the task
    from example_project.celery import app

    task = app.tasks["django_agentrun.advance_run"]
    sent = [0]

    def apply_async(*args: Any, **kwargs: Any) -> None:
        sent[0] += 1

    task.apply_async = apply_async
    return task, sent


def floor_times(n: int) -> list[float]:
    """Seconds of one single-row INSERT + COMMIT (transaction.atomic) on this connection."""
    from django.db import connection, transaction

    times = []
    for _ in range(n):
        start = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(FLOOR_SQL, ["x"])
        times.append(time.perf_counter() - start)
    return times


def round_trip_times(n: int) -> list[float]:
    """Seconds of one `SELECT 1` in autocommit mode (a bare round trip, nothing to flush)."""
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(n):
            start = time.perf_counter()
            cursor.execute("SELECT 1")
            cursor.fetchone()
            times.append(time.perf_counter() - start)
    return times


REFERENCE_SQL = """
WITH r AS (
    UPDATE agentrun_run SET updated_at = now(), last_seq = last_seq + 1
    WHERE id = %(run)s AND lease_epoch = %(epoch)s AND lease_owner = %(owner)s
    RETURNING last_seq, cancel_requested_at IS NOT NULL AS cancel
), c AS (
    UPDATE agentrun_toolcall
    SET state = %(state)s, result = %(result)s::jsonb, heartbeat_at = now()
    WHERE id = %(call)s AND EXISTS (SELECT 1 FROM r)
    RETURNING id
), e AS (
    INSERT INTO agentrun_runeventrow (run_id, seq, seq_to, events, created_at)
    SELECT %(run)s, r.last_seq, r.last_seq, jsonb_build_array(jsonb_build_array(%(kind)s::text,
           %(payload)s::jsonb)), now() FROM r, c
    RETURNING seq
)
SELECT (SELECT last_seq FROM r), (SELECT cancel FROM r), (SELECT count(*) FROM e)
"""


def reference_tool_call_times(n: int) -> list[float]:
    """Seconds of one tool call's two durable writes (in_flight, then the result), each as
    ONE statement in autocommit mode: a data-modifying CTE that does the fenced run UPDATE
    (RETURNING the seq), the tool call UPDATE and the event INSERT. What the engine's
    writes could cost; run on a scratch run of its own (never advanced)."""
    import json

    from django_agentrun import start_run
    from django_agentrun.models import Run, ToolCall, Turn

    if _reference:
        return _reference_times(n, *_reference)
    run = start_run("bench-engine", "k=1 turns=3 id=reference")
    Run.objects.filter(pk=run.pk).update(lease_owner="bench-reference", lease_epoch=1)
    turn = Turn.objects.create(run=run, index=0)
    call = ToolCall.objects.create(
        run=run,
        turn=turn,
        turn_index=0,
        tool_call_id="toolu_reference",
        position=0,
        name="lookup",
        arguments={"query": "q"},
        arguments_hash="0" * 64,
        idempotency_key="0" * 64,
    )
    base = {"run": run.pk, "epoch": 1, "owner": "bench-reference", "call": call.pk}
    started = {
        **base,
        "state": "in_flight",
        "result": "null",
        "kind": "tool_call_started",
        "payload": json.dumps(
            {
                "turn_index": 0,
                "tool_call_id": "toolu_reference",
                "attempt": 1,
                "tool_call_state": "in_flight",
            }
        ),
    }
    result = json.dumps({"answer": "42", "query": "q"})
    finished = {
        **base,
        "state": "succeeded",
        "result": json.dumps(result),
        "kind": "tool_call_finished",
        "payload": json.dumps(
            {
                "turn_index": 0,
                "tool_call_id": "toolu_reference",
                "tool_call_state": "succeeded",
                "result": result,
                "is_error": False,
                "source": "executed",
            }
        ),
    }
    _reference[:] = [started, finished]
    return _reference_times(n, started, finished)


_reference: list[dict] = []


def _reference_times(n: int, started: dict, finished: dict) -> list[float]:
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(n):
            start = time.perf_counter()
            for params in (started, finished):
                cursor.execute(REFERENCE_SQL, params)
                if cursor.fetchone()[2] != 1:
                    raise RuntimeError("reference write wrote no event")
            times.append(time.perf_counter() - start)
    return times


def _prepare_floor() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, payload text NOT NULL)"
        )
        cursor.execute("TRUNCATE bench_floor")


def run(quick: bool) -> None:
    from django.db import connection
    from django.test.utils import override_settings

    from django_agentrun import start_run
    from django_agentrun.engine import Outcome, advance
    from django_agentrun.models import Run

    from .clients import BenchClient

    section("1. Engine per turn, a task per turn (in-process, zero-latency model, heartbeat off)")
    with override_settings(AGENTRUN_TURNS_PER_TASK=1):
        _run(quick, connection, start_run, Outcome, advance, Run, BenchClient)


def _run(quick, connection, start_run, Outcome, advance, Run, BenchClient) -> None:  # noqa: N803
    runs_per_k = 10 if quick else 40  # half timed, half counted
    measured = 10
    total_turns = measured + 2
    floor_per_run = 10 if quick else 9  # about 300 / 1000 samples
    client = BenchClient()
    task, sent = _stub_dispatch()
    _prepare_floor()
    floor: list[float] = []
    rtt: list[float] = []
    reference: list[float] = []
    cpu_times: dict[Any, list[float]] = defaultdict(list)
    by_index = _BY_INDEX
    by_index.clear()
    times: dict[Any, list[float]] = defaultdict(list)
    counted: dict[Any, list[dict[str, float]]] = defaultdict(list)
    sql: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counter = SQLCounter()
    run_ids = []
    try:
        floor_times(50)  # warm up the connection, caches, code paths
        reference_tool_call_times(5)
        warm = start_run("bench-engine", "k=1 turns=3 id=warm")
        while advance(warm.pk, client=client) == Outcome.CONTINUED:
            pass
        dispatched_before = sent[0]  # from here: start_run + one per continued turn
        for r in range(runs_per_k):
            instrumented = r % 2 == 1
            for k in KS:
                run_obj = start_run("bench-engine", f"k={k} turns={total_turns} id={r}")
                run_ids.append(run_obj.pk)
                for i in range(total_turns):
                    key: Any = k if 1 <= i <= measured else ("first" if i == 0 else "final")
                    if instrumented:
                        counter.reset()
                        with counter.installed(connection):
                            start = time.perf_counter()
                            outcome = advance(run_obj.pk, client=client)
                            elapsed = time.perf_counter() - start
                        counted[key].append(
                            {
                                "queries": counter.queries,
                                "commits": counter.commits,
                                "durable": counter.durable_commits,
                                "round_trips": counter.round_trips,
                                "db": counter.db_seconds,
                                "wall": elapsed,
                            }
                        )
                        for name, values in counter.by_signature.items():
                            sql[key][name].append(sum(values))
                            sql[key][name + " #"].append(len(values))
                    else:
                        cpu = time.process_time()
                        start = time.perf_counter()
                        outcome = advance(run_obj.pk, client=client)
                        times[key].append(time.perf_counter() - start)
                        cpu_times[key].append(time.process_time() - cpu)
                        by_index[(k, i)].append(times[key][-1])
                    if outcome != Outcome.CONTINUED:
                        break
                floor += floor_times(floor_per_run)
                rtt += round_trip_times(floor_per_run)
            reference += reference_tool_call_times(floor_per_run)
        counter.reset()
        with counter.installed(connection):
            floor_times(1)
        floor_counts = (
            counter.queries,
            counter.commits,
            counter.durable_commits,
            counter.round_trips,
        )
    finally:
        del task.apply_async
    states = list(Run.objects.filter(pk__in=run_ids).values_list("state", "turn_count"))
    bad = [s for s in states if s != ("completed", total_turns)]
    if bad:
        raise RuntimeError(f"engine bench: {len(bad)} runs did not complete as scripted: {bad[:3]}")
    turns_run = sum(len(v) for v in times.values()) + sum(len(v) for v in counted.values())
    if sent[0] - dispatched_before != turns_run:  # start_run + one per continued turn
        raise RuntimeError(
            f"engine bench: {sent[0] - dispatched_before} dispatches, {turns_run} turns"
        )
    _report(
        floor, rtt, reference, floor_counts, times, cpu_times, counted, sql, measured, runs_per_k
    )


def _extra_commits(counted) -> float:
    """Durable commits a tool call adds to a turn: (commits at k=4 - at k=0) / 4."""
    per_k = {k: median([c["durable"] for c in counted[k]]) for k in (0, 4)}
    return (per_k[4] - per_k[0]) / 4


def _report(
    floor, rtt, reference, floor_counts, times, cpu_times, counted, sql, measured, runs_per_k
) -> None:
    floor_ms = median(floor) * 1000
    rtt_ms = median(rtt) * 1000
    print(
        f"  floor: one single-row INSERT + COMMIT on the same connection: median {floor_ms:.3f} ms, "
        f"p90 {pct(floor, 90) * 1000:.3f} ms (n={len(floor)}; counted as {floor_counts[0]} query, "
        f"{floor_counts[1]} commit, {floor_counts[2]} durable, {floor_counts[3]} round trips)"
    )
    print(f"  one bare round trip (SELECT 1, autocommit): median {rtt_ms:.3f} ms (n={len(rtt)})")
    print(
        f"  {runs_per_k // 2} timed + {runs_per_k // 2} counted runs per k, "
        f"{measured} measured turns each; times from the timed runs, counts from the counted runs\n"
    )
    labels = {"first": "turn 0 (queued->running)", "final": "final answer (end_turn)"}
    rows = []
    med: dict[Any, float] = {}
    cpu: dict[Any, float] = {}
    worst_commits: dict[Any, int] = {}
    for key in [*KS, "first", "final"]:
        t = [x * 1000 for x in times[key]]
        c = counted[key]
        med[key] = median(t)
        cpu[key] = median([x * 1000 for x in cpu_times[key]])
        worst_commits[key] = max(int(x["commits"]) for x in c)
        durable = max(int(x["durable"]) for x in c)
        db_share = median([x["db"] / x["wall"] for x in c])
        rows.append(
            [
                f"{key} tool calls" if key in KS else labels[key],
                len(t),
                med[key],
                pct(t, 90),
                cpu[key],
                median([x["queries"] for x in c]),
                median([x["round_trips"] for x in c]),
                worst_commits[key],
                durable,
                f"{2 + key}" if key in KS else "-",
                f"{db_share * 100:.0f}%",
                med[key] / (floor_ms * durable) if durable else float("nan"),
            ]
        )
    print(
        table(
            [
                "turn",
                "n",
                "median ms",
                "p90 ms",
                "CPU ms",
                "queries",
                "round trips",
                "commits",
                "durable",
                "target",
                "in DB",
                "x floor*durable",
            ],
            rows,
        )
    )
    marginal = (med[4] - med[0]) / 4
    marginal_cpu = (cpu[4] - cpu[0]) / 4
    print(
        "  (CPU ms: this process's CPU time per turn, time.process_time; the rest of the wall\n"
        "   time is waiting for Postgres or for a CPU on a busy machine)"
    )
    print(
        f"\n  marginal cost of one durable tool call ((t4 - t0) / 4): {marginal:.3f} ms "
        f"= {marginal / floor_ms:.2f} floor commits = {marginal / rtt_ms:.1f} round trips;\n"
        f"  of which CPU in this process: {marginal_cpu:.3f} ms"
    )
    ref_ms = median(reference) * 1000
    print(
        f"  reference: the same two durable writes of one tool call as two single-statement CTEs\n"
        f"  in autocommit (fenced run UPDATE + tool call UPDATE + event INSERT each): {ref_ms:.3f} ms\n"
        f"  = {ref_ms / floor_ms:.2f} floor commits (n={len(reference)}); the engine spends "
        f"{marginal / ref_ms:.1f}x that\n"
        f"  (a result shares its commit with the next call's in_flight, so an extra call\n"
        f"  costs the engine {_extra_commits(counted):.2f} durable commits here, not 2)"
    )
    _history_growth(_BY_INDEX, measured)
    _breakdown(sql, counted)
    for k in KS:
        check(
            NAME,
            f"commits per turn (a task each) <= k + 2 (k={k})",
            worst_commits[k] <= 2 + k,
            f"{worst_commits[k]} (target {2 + k})",
        )
    bound = TARGET_FLOOR_FACTOR * floor_ms * 4
    check(
        NAME,
        "one-tool turn within 4x of 4 floor commits",
        med[1] <= bound,
        f"{med[1]:.3f} ms vs {bound:.3f} ms ({med[1] / (floor_ms * 4):.2f}x)",
    )
    check(
        NAME, "marginal tool call <= 1.2 ms", marginal <= TARGET_MARGINAL_MS, f"{marginal:.3f} ms"
    )
    figure(NAME, "floor INSERT+COMMIT (median)", f"{floor_ms:.3f} ms")
    figure(NAME, "bare round trip (median)", f"{rtt_ms:.3f} ms")
    for k in KS:
        figure(NAME, f"turn with {k} tool calls (median)", f"{med[k]:.3f} ms")
    figure(NAME, "marginal durable tool call", f"{marginal:.3f} ms")
    figure(NAME, "marginal tool call: client CPU", f"{marginal_cpu:.3f} ms")
    figure(NAME, "reference: tool call as 2 CTE statements", f"{ref_ms:.3f} ms")


_BY_INDEX: dict[tuple[int, int], list[float]] = defaultdict(list)  # (k, turn index) -> seconds


def _history_growth(by_index, measured: int) -> None:
    """Each claim reloads the run, all its turns and all its tool calls: does a turn get
    slower as the history grows?"""
    parts = []
    for k in KS:
        first = median(by_index[(k, 1)]) * 1000
        last = median(by_index[(k, measured)]) * 1000
        parts.append(f"k={k}: {first:.2f} -> {last:.2f} ms")
    print(f"  turn 1 -> turn {measured} (history grows; median of timed runs): " + "; ".join(parts))


def _breakdown(sql, counted) -> None:
    """Statements per turn by kind, and what one more tool call adds."""
    names = sorted({n for k in KS for n in sql[k] if not n.endswith(" #")})
    turns = {k: max(1, len(counted[k])) for k in KS}
    rows = []
    for name in names:
        counts = {k: sum(sql[k].get(name + " #", [])) / turns[k] for k in KS}
        ms = {k: sum(sql[k].get(name, [])) * 1000 / turns[k] for k in KS}
        rows.append(
            [
                name,
                counts[0],
                counts[1],
                counts[4],
                (counts[4] - counts[0]) / 4,
                ms[1],
                (ms[4] - ms[0]) / 4,
            ]
        )
    python = {k: median([(x["wall"] - x["db"]) * 1000 for x in counted[k]]) for k in KS}
    rows.append(
        ["(Python, outside the database)", "", "", "", "", python[1], (python[4] - python[0]) / 4]
    )
    rows.sort(key=lambda r: -(r[6] if isinstance(r[6], float) else 0))
    print(
        "\n  statements per turn (counted runs), by kind; ms = time inside execute() (psycopg 3 sends\n"
        "  BEGIN with a block's first statement) or commit(); the COMMIT count is transaction blocks:"
    )
    print(
        table(
            ["statement", "k=0", "k=1", "k=4", "per tool call", "ms (k=1)", "ms per tool call"],
            rows,
        )
    )
