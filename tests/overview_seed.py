"""Rows for the admin overview's tests (db and browser tiers), and the figures each chart
must show, computed apart from the page: plain SELECTs of the rows and arithmetic in
Python (and Postgres's own `percentile_cont` in raw SQL where the database is Postgres).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection

from django_agentrun.models import Run, ToolCall, Turn
from django_agentrun.states import RunState, ToolCallState, TurnState

AGENTS = ("support-bot", "research", "billing")
MODELS = ("claude-sonnet-5-5", "claude-haiku-4-5")
TOOLS = ("search", "lookup_order", "refund")
CODES = ("budget_exceeded", "model_error", "tool_crashed")
FINAL = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT)


def seed(now: datetime, *, runs: int = 60, seed_value: int = 7, owner: Any = None) -> None:
    """`runs` finished runs spread over the last 40 days (some outside every window), each
    with turns and tool calls of known durations, a few runs still active, and calls
    waiting for a person at several ages."""
    rng = random.Random(seed_value)
    for i in range(runs):
        finished = now - timedelta(
            hours=rng.choice([0.2, 1.5, 5, 20, 30, 60, 100, 160, 300, 500, 900]) + rng.random()
        )
        state = FINAL[i % len(FINAL)] if i % 3 else RunState.COMPLETED
        run = Run.objects.create(agent=AGENTS[i % 3], input=f"task {i}", owner=owner)
        tokens = {
            "input_tokens": rng.randint(100, 5000),
            "cache_creation_input_tokens": rng.choice([0, 1000]),
            "cache_read_input_tokens": rng.choice([0, 2000, 8000]),
        }
        Run.objects.filter(pk=run.pk).update(
            state=state,
            created_at=finished - timedelta(minutes=5),
            started_at=finished - timedelta(minutes=4),
            finished_at=finished,
            cost_usd=Decimal(rng.randint(1, 90_000)) / Decimal(1_000_000),
            error_code=CODES[i % len(CODES)] if state == RunState.FAILED else "",
            **tokens,
        )
        for index in range(2):
            begun = finished - timedelta(minutes=3 - index)
            turn = Turn.objects.create(
                run=run, index=index, model=MODELS[(i + index) % 2], started_at=begun
            )
            turn_state = TurnState.COMPLETED if (i + index) % 5 else TurnState.FAILED
            Turn.objects.filter(pk=turn.pk).update(
                state=turn_state, finished_at=begun + timedelta(seconds=rng.uniform(0.5, 40))
            )
            if index == 0:
                started = begun + timedelta(seconds=1)
                _call(
                    run,
                    turn,
                    TOOLS[i % 3],
                    ToolCallState.SUCCEEDED,
                    begun,
                    started=started,
                    finished=started + timedelta(seconds=rng.uniform(0.01, 9)),
                )
    for hours in (0.5, 3, 10, 30, 100):  # waiting for a person
        run = Run.objects.create(agent=AGENTS[1], input="waiting", owner=owner)
        Run.objects.filter(pk=run.pk).update(state=RunState.AWAITING_APPROVAL)
        asked = now - timedelta(hours=hours)
        turn = Turn.objects.create(run=run, index=0, model=MODELS[0], started_at=asked)
        state = ToolCallState.UNKNOWN if hours == 10 else ToolCallState.AWAITING_APPROVAL
        _call(run, turn, "refund", state, asked)
    Run.objects.create(agent=AGENTS[0], input="still queued", owner=owner)


def _call(run, turn, name, state, created, *, started=None, finished=None) -> None:
    call = ToolCall.objects.create(
        run=run,
        turn=turn,
        turn_index=turn.index,
        tool_call_id=f"toolu_{run.pk.hex[:8]}_{turn.index}",
        position=0,
        name=name,
        arguments_hash="0" * 64,
        idempotency_key="0" * 64,
        created_at=created,
    )
    ToolCall.objects.filter(pk=call.pk).update(
        state=state, started_at=started, finished_at=finished
    )


# --------------------------------------------------------------------------- direct figures


def _rows(sql: str, params: list[Any] | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def _utc(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite through a bare cursor
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _finished_since(start: datetime) -> list[tuple]:
    return [
        (state, _utc(finished), agent, cost, i, c, r, code)
        for state, finished, agent, cost, i, c, r, code in _rows(
            "SELECT state, finished_at, agent, cost_usd, input_tokens, "
            "cache_creation_input_tokens, cache_read_input_tokens, error_code "
            "FROM agentrun_run WHERE finished_at IS NOT NULL"
        )
        if state in FINAL and _utc(finished) >= start
    ]


def runs_by_state(start: datetime, unit: str) -> dict[tuple[str, str], int]:
    """(bucket start ISO, state) -> runs finished in it (non-zero ones)."""
    counts: Counter = Counter()
    for state, finished, *_rest in _finished_since(start):
        bucket = finished.replace(minute=0, second=0, microsecond=0)
        if unit == "day":
            bucket = bucket.replace(hour=0)
        counts[(bucket.isoformat(), state)] += 1
    return dict(counts)


def cost_by_day(start: datetime) -> dict[tuple[str, str], Decimal]:
    sums: dict = defaultdict(Decimal)
    for _s, finished, agent, cost, *_rest in _finished_since(start):
        sums[(finished.date().isoformat(), agent)] += Decimal(str(cost))
    return dict(sums)


def cache_share(start: datetime) -> dict[str, float]:
    whole: dict = defaultdict(int)
    read: dict = defaultdict(int)
    for _s, _f, agent, _c, i, c, r, _code in _finished_since(start):
        for key in (agent, "all"):
            whole[key] += i + c + r
            read[key] += r
    return {key: read[key] / whole[key] for key in whole if whole[key]}


def failure_codes(start: datetime) -> dict[str, int]:
    return dict(Counter(code for s, *_m, code in _finished_since(start) if s == RunState.FAILED))


def _percentile(values: list[float], fraction: float) -> float:
    values = sorted(values)
    position = fraction * (len(values) - 1)
    low, high = math.floor(position), math.ceil(position)
    return values[low] + (values[high] - values[low]) * (position - low)


def _latency(rows: list[tuple], start: datetime) -> dict[str, tuple[int, float, float]]:
    groups: dict = defaultdict(list)
    for name, begun, ended in rows:
        if ended is None or begun is None or _utc(ended) < start:
            continue
        seconds = (_utc(ended) - _utc(begun)).total_seconds()
        groups[name].append(seconds)
        groups["all"].append(seconds)
    return {k: (len(v), _percentile(v, 0.5), _percentile(v, 0.95)) for k, v in groups.items()}


def latency_rows(what: str, start: datetime) -> list[tuple[str, datetime, datetime]]:
    """(model or tool, started, finished) of the turns (completed) or calls (that ran a
    handler) that ended since `start`."""
    if what == "turns":
        rows = _rows(
            "SELECT model, started_at, finished_at FROM agentrun_turn WHERE state = %s",
            [TurnState.COMPLETED],
        )
    else:
        rows = _rows("SELECT name, started_at, finished_at FROM agentrun_toolcall")
    return [
        (name, _utc(begun), _utc(ended))
        for name, begun, ended in rows
        if begun is not None and ended is not None and _utc(ended) >= start
    ]


def turn_latency(start: datetime) -> dict[str, tuple[int, float, float]]:
    return _latency(latency_rows("turns", start), start)


def tool_latency(start: datetime) -> dict[str, tuple[int, float, float]]:
    return _latency(latency_rows("tools", start), start)


def postgres_percentiles(table: str, group: str, start: datetime, where: str) -> dict:
    """Postgres's own percentile_cont of the same rows, per group."""
    rows = _rows(
        f"SELECT {group}, percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM "  # noqa: S608
        f"finished_at - started_at)), percentile_cont(0.95) WITHIN GROUP (ORDER BY "
        f"EXTRACT(EPOCH FROM finished_at - started_at)) FROM {table} "
        f"WHERE finished_at >= %s AND {where} GROUP BY {group}",
        [start],
    )
    return {name: (float(p50), float(p95)) for name, p50, p95 in rows}


def waiting(now: datetime) -> dict[tuple[int, str], int]:
    """(age bucket index, state) -> calls waiting for a person."""
    limits = [timedelta(hours=1), timedelta(hours=6), timedelta(days=1), timedelta(days=3)]
    counts: Counter = Counter()
    for state, created in _rows(
        "SELECT state, created_at FROM agentrun_toolcall WHERE state IN (%s, %s)",
        [ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN],
    ):
        age = now - _utc(created)
        counts[(sum(age >= limit for limit in limits), state)] += 1
    return dict(counts)


# --------------------------------------------------------------------------- the page's figures


def page_figures(now: datetime) -> dict[str, Any]:
    """Every figure admin/overview_data.py computes for the page in each window at `now`,
    as JSON (times in ISO, costs as text, shares and latencies rounded to 1e-6 s): what
    tests/db/golden/overview_figures.json holds, computed before issue #38 changed the
    run table's indexes, so the page shows the same numbers on the same rows."""
    from django_agentrun.admin import overview_data as data

    def iso(value: datetime) -> str:
        return value.astimezone(UTC).isoformat()

    def rounded(value: Any) -> Any:
        return None if value is None else round(float(value), 6)

    runs = Run.objects.all()
    out: dict[str, Any] = {}
    for key in data.WINDOWS:
        w = data.window(key, now)
        days, agents, cells = data.cost_by_day(runs, w)
        turns, turn_cut = data.turn_latency(runs, w)
        tools, tool_cut = data.tool_latency(runs, w)
        latency = [
            {"name": r["name"], "n": r["n"], "p50": rounded(r["p50"]), "p95": rounded(r["p95"])}
            for r in turns + tools
        ]
        out[key] = {
            "runs_by_state": [[iso(b), counts] for b, counts in data.runs_by_state(runs, w)],
            "cost_by_day": {
                "days": [iso(d) for d in days],
                "agents": agents,
                "cells": sorted([iso(d), a, f"{Decimal(c):.6f}"] for (d, a), c in cells.items()),
            },
            "cache_share": [{**r, "share": rounded(r["share"])} for r in data.cache_share(runs, w)],
            "failure_codes": [list(r) for r in data.failure_codes(runs, w)],
            "latency": latency,
            "cuts": [turn_cut and iso(turn_cut), tool_cut and iso(tool_cut)],
        }
    waiting = data.waiting(runs, now)
    out["waiting"] = {
        "ages": [[label, counts] for label, counts in waiting["ages"]],
        "oldest": [[c.name, c.state, iso(c.created_at)] for c in waiting["oldest"]],
    }
    return out
