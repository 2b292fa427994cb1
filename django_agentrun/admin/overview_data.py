"""The numbers of the admin overview, each one aggregate query over a time window.

Every figure is computed in the database (grouped by `date_trunc` buckets in UTC, summed,
counted); the latency percentiles with `percentile_cont` on Postgres and the same linear
interpolation in Python elsewhere (SQLite), so both give the same numbers. Each query is
served by a partial index on the time a row ended (`agentrun_run_finished_at_idx`, whose
runs' figures are read from their rows: no index key of the run table changes while a run
is live, docs/explanation/storage.md; `agentrun_turn_finished_idx`,
`agentrun_toolcall_finished_idx`, index-only) or by the pending-calls index;
`bench/overview.py` times them on 1,000,000 runs.

What counts where:
- a run counts in the window it *finished* in (`finished_at`), in its final state
  (completed, failed, cancelled, timed_out); its cost and tokens count on that day;
- a turn's latency is from its start (before its model request) to its close (the answer,
  or its last tool result), for completed turns that closed in the window, the latest
  LATENCY_SAMPLE of them;
- a tool call's latency is its last attempt's, from `in_flight` to its result, for calls
  that ran a handler (`started_at` set) and closed in the window, the latest
  LATENCY_SAMPLE of them;
- the cache-read share is `cache_read_input_tokens` over all input tokens (`input_tokens +
  cache_creation_input_tokens + cache_read_input_tokens`: the API counts the three apart);
- calls waiting for a person (approval or an unknown outcome) count now, whatever the
  window, aged from when the model asked for them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connections
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    FloatField,
    Q,
    QuerySet,
    Sum,
)
from django.db.models.functions import Extract, Trunc

from ..models import Run, ToolCall, Turn
from ..states import RUN_ACTIVE, RunState, ToolCallState, TurnState

#: The run states a run ends in, in the order the charts stack them.
FINAL_STATES = tuple(s for s in RunState.values if s not in RUN_ACTIVE)
#: The time windows of the page: its label, how many buckets, and their unit.
WINDOWS: dict[str, tuple[str, int, str]] = {
    "24h": ("Last 24 hours", 24, "hour"),
    "7d": ("Last 7 days", 7 * 24, "hour"),
    "30d": ("Last 30 days", 30, "day"),
}
DEFAULT_WINDOW = "7d"
#: Bars of the charts that list groups (agents, models, tools, failure codes).
TOP = 10
#: The ages of waiting calls: (label, lower bound).
AGES = (
    ("under 1 h", timedelta(0)),
    ("1-6 h", timedelta(hours=1)),
    ("6-24 h", timedelta(hours=6)),
    ("1-3 days", timedelta(days=1)),
    ("over 3 days", timedelta(days=3)),
)
WAITING_STATES = (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)
#: Latency percentiles are over the window's latest this many turns (tool calls): a bounded
#: sort whatever the window and the traffic; the page says where it cut.
LATENCY_SAMPLE = 20_000
OLDEST_SHOWN = 5


class BadWindow(ValueError):
    """The `window` parameter names no window of the page."""


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    unit: str  # "hour" or "day"
    buckets: tuple[datetime, ...]  # each bucket's start, UTC
    now: datetime

    @property
    def start(self) -> datetime:
        return self.buckets[0]

    @property
    def step(self) -> timedelta:
        return timedelta(hours=1) if self.unit == "hour" else timedelta(days=1)


def window(key: str | None, now: datetime) -> Window:
    """The window `key` names, its buckets ending with the one `now` is in."""
    key = key or DEFAULT_WINDOW
    if key not in WINDOWS:
        raise BadWindow(f"Unknown window {key[:40]!r}: choose one of {', '.join(WINDOWS)}.")
    label, count, unit = WINDOWS[key]
    now = now.astimezone(UTC)
    last = now.replace(minute=0, second=0, microsecond=0)
    if unit == "day":
        last = last.replace(hour=0)
    step = timedelta(hours=1) if unit == "hour" else timedelta(days=1)
    buckets = tuple(last - step * (count - 1 - i) for i in range(count))
    return Window(key=key, label=label, unit=unit, buckets=buckets, now=now)


def _day(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _finished(runs: QuerySet[Run], w: Window) -> QuerySet[Run]:
    return runs.filter(finished_at__gte=w.start, state__in=FINAL_STATES)


# --------------------------------------------------------------------------- runs


def runs_by_state(runs: QuerySet[Run], w: Window) -> list[tuple[datetime, dict[str, int]]]:
    """Runs that finished in each bucket, by final state (every bucket, zeros included)."""
    rows = (
        _finished(runs, w)
        .annotate(bucket=Trunc("finished_at", w.unit, tzinfo=UTC))
        .values("bucket", "state")
        .annotate(n=Count("*"))
        .order_by()
    )
    counts: dict[datetime, dict[str, int]] = {b: dict.fromkeys(FINAL_STATES, 0) for b in w.buckets}
    for row in rows:
        bucket = row["bucket"].astimezone(UTC)
        if bucket in counts:
            counts[bucket][row["state"]] = row["n"]
    return list(counts.items())


def cost_by_day(
    runs: QuerySet[Run], w: Window
) -> tuple[list[datetime], list[str], dict[tuple[datetime, str], Decimal]]:
    """Cost (USD) of the runs that finished each day of the window, by agent: the days, the
    agents (costliest first; past TOP the rest is "other"), and (day, agent) -> cost."""
    rows = (
        _finished(runs, w)
        .annotate(day=Trunc("finished_at", "day", tzinfo=UTC))
        .values("day", "agent")
        .annotate(cost=Sum("cost_usd"))
        .order_by()
    )
    totals: dict[str, Decimal] = defaultdict(Decimal)
    cells: dict[tuple[datetime, str], Decimal] = {}
    for row in rows:
        totals[row["agent"]] += row["cost"] or 0
        cells[(row["day"].astimezone(UTC), row["agent"])] = row["cost"] or Decimal(0)
    agents = sorted(totals, key=lambda a: (-totals[a], a))
    shown, rest = agents[:TOP], set(agents[TOP:])
    folded: dict[tuple[datetime, str], Decimal] = defaultdict(Decimal)
    for (day, agent), cost in cells.items():
        folded[(day, "other" if agent in rest else agent)] += cost
    if rest:
        shown.append("other")
    first = _day(w.start)
    days = [first + timedelta(days=i) for i in range((_day(w.now) - first).days + 1)]
    return days, shown, dict(folded)


def cache_share(runs: QuerySet[Run], w: Window) -> list[dict[str, Any]]:
    """Per agent (most input first, TOP of them) and "all": the input tokens of the runs that
    finished in the window and the share read from the cache."""
    sums = {
        "input": Sum("input_tokens"),
        "creation": Sum("cache_creation_input_tokens"),
        "read": Sum("cache_read_input_tokens"),
    }
    rows = list(_finished(runs, w).values("agent").annotate(**sums).order_by())
    total = _finished(runs, w).aggregate(**sums)
    result = []
    for agent, row in [("all", total)] + [(r["agent"], r) for r in rows]:
        whole = sum(int(row[k] or 0) for k in ("input", "creation", "read"))
        read = int(row["read"] or 0)
        result.append(
            {
                "agent": agent,
                "tokens": whole,
                "read": read,
                "share": read / whole if whole else None,
            }
        )
    head, rest = result[:1], sorted(result[1:], key=lambda r: (-r["tokens"], r["agent"]))
    return head + rest[:TOP]


def failure_codes(runs: QuerySet[Run], w: Window) -> list[tuple[str, int]]:
    """The most frequent error codes of the runs that failed in the window."""
    rows = (
        runs.filter(finished_at__gte=w.start, state=RunState.FAILED)
        .values("error_code")
        .annotate(n=Count("*"))
        .order_by("-n", "error_code")[:TOP]
    )
    return [(row["error_code"], row["n"]) for row in rows]


# --------------------------------------------------------------------------- latency


class Percentile(Aggregate):
    """Postgres's `percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)`."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """`percentile_cont`'s value: linear interpolation between the closest ranks."""
    if not sorted_values:
        return None
    position = fraction * (len(sorted_values) - 1)
    low, high = math.floor(position), math.ceil(position)
    a, b = sorted_values[low], sorted_values[high]
    return a + (b - a) * (position - low)


def _latency(rows: QuerySet[Any], group: str) -> list[dict[str, Any]]:
    """p50/p95 seconds of `finished_at - started_at` of `rows`, per `group` (the TOP
    groups by count) and "all" first."""
    duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    if connections[rows.db].vendor == "postgresql":
        seconds = Extract(duration, "epoch")
        figures = {
            "n": Count("*"),
            "p50": Percentile(seconds, 0.5),
            "p95": Percentile(seconds, 0.95),
        }
        total = rows.aggregate(**figures)
        groups = list(rows.values(group).annotate(**figures).order_by("-n", group)[:TOP])
        found = [{"name": "all", **total}] + [{"name": g.pop(group), **g} for g in groups]
        return [r for r in found if r["n"]]
    # Elsewhere: the durations themselves, the same interpolation in Python.
    values: dict[str, list[float]] = defaultdict(list)
    for name, span in rows.annotate(span=duration).values_list(group, "span"):
        values[name].append(span.total_seconds())
    every = sorted(v for vs in values.values() for v in vs)
    names = sorted(values, key=lambda n: (-len(values[n]), n))[:TOP]
    result = []
    for name, sample in [("all", every)] + [(n, sorted(values[n])) for n in names]:
        if sample:
            result.append(
                {
                    "name": name,
                    "n": len(sample),
                    "p50": percentile(sample, 0.5),
                    "p95": percentile(sample, 0.95),
                }
            )
    return result


def _latest(rows: QuerySet[Any]) -> tuple[QuerySet[Any], datetime | None]:
    """`rows` cut to the latest LATENCY_SAMPLE by `finished_at` (ties kept), and the time
    of the cut (None when the window holds fewer): a backward scan of the index."""
    nth = rows.order_by("-finished_at").values_list("finished_at", flat=True)
    cut = next(iter(nth[LATENCY_SAMPLE - 1 : LATENCY_SAMPLE]), None)
    return (rows if cut is None else rows.filter(finished_at__gte=cut)), cut


def turn_latency(runs: QuerySet[Run], w: Window) -> tuple[list[dict[str, Any]], datetime | None]:
    """Latency of the turns completed in the window (its latest LATENCY_SAMPLE), overall
    and per model; and the time of the cut, if any."""
    turns = Turn.objects.filter(state=TurnState.COMPLETED, finished_at__gte=w.start)
    latest, cut = _latest(_of_runs(turns, runs))
    return _latency(latest, "model"), cut


def tool_latency(runs: QuerySet[Run], w: Window) -> tuple[list[dict[str, Any]], datetime | None]:
    """Latency of the tool calls that ran a handler and closed in the window (its latest
    LATENCY_SAMPLE), per tool; and the time of the cut, if any."""
    calls = ToolCall.objects.filter(started_at__isnull=False, finished_at__gte=w.start)
    latest, cut = _latest(_of_runs(calls, runs))
    return _latency(latest, "name"), cut


def _of_runs(rows: QuerySet[Any], runs: QuerySet[Run]) -> QuerySet[Any]:
    return rows.filter(run__in=runs.values("pk")) if runs.query.has_filters() else rows


# --------------------------------------------------------------------------- waiting


def waiting(runs: QuerySet[Run], now: datetime) -> dict[str, Any]:
    """Calls waiting for a person now: counts by age and state, and the oldest few."""
    calls = _of_runs(ToolCall.objects.filter(state__in=WAITING_STATES), runs)
    # Age bucket i: asked at or before now - AGES[i] and after now - AGES[i + 1] (the first
    # has no newer bound, a clock ahead of the database's included; the last no older one).
    bounds = [None] + [now - low for _label, low in AGES[1:]] + [None]
    figures = {}
    for i in range(len(AGES)):
        newest, oldest = bounds[i], bounds[i + 1]
        for state in WAITING_STATES:
            condition = Q(state=state)
            if newest is not None:
                condition &= Q(created_at__lte=newest)
            if oldest is not None:
                condition &= Q(created_at__gt=oldest)
            figures[f"{i}-{state}"] = Count("pk", filter=condition)
    counts = calls.aggregate(**figures)
    ages = [
        (label, {state: counts[f"{i}-{state}"] for state in WAITING_STATES})
        for i, (label, _low) in enumerate(AGES)
    ]
    oldest = list(calls.select_related("run").order_by("created_at", "pk")[:OLDEST_SHOWN])
    return {"ages": ages, "oldest": oldest}
