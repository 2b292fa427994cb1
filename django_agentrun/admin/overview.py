"""The admin overview: what the agents did in a window (24 h, 7 d, 30 d), as SVG charts
that link to the run list filtered to what each bar counts. For staff with
`agentrun.view_overview` (OVERVIEW_PERMISSION); it counts the runs the user may see.

The numbers come from `overview_data` (one aggregate query each), the pictures from
`charts`; this module turns the first into the second, with the links and tables.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..permissions import can_view_overview
from ..states import RunState
from . import charts, overview_data
from .charts import Bar
from .overview_data import FINAL_STATES, WAITING_STATES, WINDOWS, BadWindow, Window
from .visibility import visible_runs

STATE_COLOURS = {
    RunState.COMPLETED: "#2b8a3e",
    RunState.FAILED: "#c92a2a",
    RunState.CANCELLED: "#868e96",
    RunState.TIMED_OUT: "#e8590c",
}
#: The run list's filters the overview links with, beyond the list's own (state, agent).
LINK_LOOKUPS = frozenset({"error_code", "finished_at__gte", "finished_at__lt"})


def _iso(value: datetime) -> str:
    return value.isoformat()


def runs_url(**params: Any) -> str:
    return reverse("admin:agentrun_run_changelist") + "?" + urlencode(params)


def _seconds(value: float) -> str:
    if value >= 100:
        return f"{value:.0f} s"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.4f}"


def _share(value: float) -> str:
    return f"{value * 100:.1f} %"


def _tick(w: Window, bucket: datetime) -> str:
    """The axis label of a bucket, or "" for none: every 3 hours of a day, each day of a
    week (at midnight), every third day of a month."""
    if w.unit == "day":
        first = (bucket - w.start).days % 3 == 0
        return bucket.strftime("%d %b") if first else ""
    if len(w.buckets) <= 24:
        return bucket.strftime("%H:%M") if bucket.hour % 3 == 0 else ""
    return bucket.strftime("%d %b") if bucket.hour == 0 else ""


def bad_list_parameter(params: Any) -> str | None:
    """What is wrong with the run list's query parameters, said plainly; None if nothing."""
    for key, values in params.lists():
        if any("\x00" in value for value in values) or "\x00" in key:
            return f"The filter {key[:40]!r} has a NUL character: the list is shown unfiltered."
        if key in ("finished_at__gte", "finished_at__lt"):
            if parse_datetime(values[-1]) is None:
                return (
                    f"The filter {key} needs a date and time (ISO 8601, e.g. "
                    f"2026-12-04T10:00:00+00:00), not {values[-1][:40]!r}: the list is shown "
                    "unfiltered."
                )
    return None


def overview_filters(params: Any) -> list[str]:
    """The overview's filters a link set, in words (the list's own sidebar has no place
    for them)."""
    words = []
    if params.get("finished_at__gte") or params.get("finished_at__lt"):
        since, until = params.get("finished_at__gte"), params.get("finished_at__lt")
        words.append(
            "finished" + (f" from {since}" if since else "") + (f" until {until}" if until else "")
        )
    if "error_code" in params:
        words.append(f"error code {params['error_code'] or '(none)'}")
    return words


class OverviewMixin:
    """RunAdmin's overview page at `<changelist>/overview/` and the lookups its links use."""

    def get_urls(self):
        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        own = [path("overview/", wrap(self.overview_view), name="agentrun_run_overview")]
        return own + super().get_urls()  # type: ignore[misc]

    def lookup_allowed(self, lookup: str, value: Any, request: Any = None) -> bool:
        if lookup in LINK_LOOKUPS:
            return True
        return super().lookup_allowed(lookup, value, request)  # type: ignore[misc]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        problem = bad_list_parameter(request.GET)
        if problem is not None:
            # Refused out loud, before a database sees it (Postgres refuses NUL in text).
            messages.error(request, problem)
            return HttpResponseRedirect(reverse("admin:agentrun_run_changelist"))
        extra: dict[str, Any] = {"overview_filters": overview_filters(request.GET)}
        if can_view_overview(request.user):
            extra["overview_url"] = reverse("admin:agentrun_run_overview")
        return super().changelist_view(request, {**(extra_context or {}), **extra})  # type: ignore[misc]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not can_view_overview(request.user):
            raise PermissionDenied("Viewing the overview needs agentrun.view_overview.")
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": "Agent runs: overview",
            "opts": self.model._meta,  # type: ignore[attr-defined]
            "windows": [(key, label) for key, (label, _n, _u) in WINDOWS.items()],
            "runs_url": reverse("admin:agentrun_run_changelist"),
        }
        try:
            w = overview_data.window(request.GET.get("window"), timezone.now())
        except BadWindow as exc:
            context["error"] = str(exc)
            return TemplateResponse(
                request, "admin/agentrun/run/overview.html", context, status=400
            )
        context.update(window=w, charts=overview_charts(visible_runs(request.user), w))
        return TemplateResponse(request, "admin/agentrun/run/overview.html", context)


def overview_charts(runs: Any, w: Window) -> list[dict[str, Any]]:
    """Every chart of the page: its heading, SVG, table (heads and rows) and list link."""
    since = {"finished_at__gte": _iso(w.start)}
    return [
        _runs_chart(runs, w),
        _cost_chart(runs, w),
        _latency_chart(
            "Turn latency (p50 / p95)",
            "Seconds from a turn's start to its close, by model.",
            *overview_data.turn_latency(runs, w),
            "model",
            runs_url(**since),
        ),
        _latency_chart(
            "Tool latency (p50 / p95)",
            "Seconds from a call's handler start to its result, by tool.",
            *overview_data.tool_latency(runs, w),
            "tool",
            runs_url(**since),
        ),
        _cache_chart(runs, w),
        _waiting_chart(runs, w),
        _failures_chart(runs, w),
    ]


def _runs_chart(runs: Any, w: Window) -> dict[str, Any]:
    rows = overview_data.runs_by_state(runs, w)
    groups = []
    for bucket, counts in rows:
        end = bucket + w.step
        link = {"finished_at__gte": _iso(bucket), "finished_at__lt": _iso(end)}
        groups.append(
            (
                _tick(w, bucket),
                [
                    Bar(
                        bucket.isoformat(),
                        state,
                        counts[state],
                        runs_url(state__exact=state, **link),
                        f"{bucket:%Y-%m-%d %H:%M} UTC: {counts[state]} {state}",
                    )
                    for state in FINAL_STATES
                ],
            )
        )
    title = f"Runs per {w.unit} by final state"
    svg = charts.columns(
        title,
        f"Runs that finished in each {w.unit} (UTC) of the window, stacked by final state.",
        groups,
        charts.colours(FINAL_STATES, STATE_COLOURS),
    )
    table = [
        [f"{bucket:%Y-%m-%d %H:%M}", *(counts[s] for s in FINAL_STATES)]
        for bucket, counts in rows
        if any(counts.values())
    ]
    return {
        "key": "runs",
        "title": title,
        "svg": svg,
        "heads": [f"{w.unit} (UTC)", *FINAL_STATES],
        "rows": table,
        "url": runs_url(finished_at__gte=_iso(w.start)),
    }


def _cost_chart(runs: Any, w: Window) -> dict[str, Any]:
    days, agents, cells = overview_data.cost_by_day(runs, w)
    groups = []
    for day in days:
        end = day + timedelta(days=1)
        link = {"finished_at__gte": _iso(max(day, w.start)), "finished_at__lt": _iso(end)}
        pieces = []
        for agent in agents:
            cost = float(cells.get((day, agent), Decimal(0)))
            params = dict(link) if agent == "other" else {"agent__exact": agent, **link}
            pieces.append(
                Bar(
                    day.date().isoformat(),
                    agent,
                    cost,
                    runs_url(**params),
                    f"{day:%Y-%m-%d}: {agent} {_usd(cost)}",
                )
            )
        every = max(1, len(days) // 10)
        groups.append((day.strftime("%d %b") if (day - days[0]).days % every == 0 else "", pieces))
    svg = charts.columns(
        "Cost per day per agent",
        "US dollars of the runs that finished each day (UTC), stacked by agent.",
        groups,
        charts.colours(agents),
        axis=_usd,
    )
    table = [
        [day.date().isoformat(), agent, f"{cells[(day, agent)]:.6f}"]
        for day in days
        for agent in agents
        if cells.get((day, agent))
    ]
    return {
        "key": "cost",
        "title": "Cost per day per agent",
        "svg": svg,
        "heads": ["day (UTC)", "agent", "cost (USD)"],
        "rows": table,
        "url": runs_url(finished_at__gte=_iso(w.start)),
    }


def _latency_chart(
    title: str, desc: str, rows: list[dict], cut: datetime | None, what: str, url: str
) -> dict[str, Any]:
    groups = [
        (
            row["name"] or "(none)",
            [
                Bar(row["name"], p, row[p], url, f"{row['name']} {p}: {_seconds(row[p])}")
                for p in ("p50", "p95")
            ],
        )
        for row in rows
    ]
    svg = charts.bars(title, desc, groups, {"p50": "#2f7ed8", "p95": "#e8590c"}, axis=_seconds)
    table = [[r["name"], r["n"], f"{r['p50']:.3f}", f"{r['p95']:.3f}"] for r in rows]
    key = "turns" if what == "model" else "tools"
    return {
        "note": (
            f"Over the latest {overview_data.LATENCY_SAMPLE:,} of the window: since "
            f"{cut.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC."
            if cut
            else ""
        ),
        "key": key,
        "title": title,
        "svg": svg,
        "heads": [what, "count", "p50 (s)", "p95 (s)"],
        "rows": table,
        "url": url,
    }


def _cache_chart(runs: Any, w: Window) -> dict[str, Any]:
    rows = [r for r in overview_data.cache_share(runs, w) if r["share"] is not None]
    since = {"finished_at__gte": _iso(w.start)}
    groups = [
        (
            r["agent"],
            [
                Bar(
                    r["agent"],
                    "share",
                    r["share"],
                    runs_url(**since)
                    if r["agent"] == "all"
                    else runs_url(agent__exact=r["agent"], **since),
                    f"{r['agent']}: {_share(r['share'])} of {r['tokens']:,} input tokens",
                )
            ],
        )
        for r in rows
    ]
    title = "Cache-read share of input tokens"
    svg = charts.bars(
        title,
        "Cache-read input tokens over all input tokens of the runs that finished, by agent.",
        groups,
        {"share": "#0b7285"},
        axis=_share,
        top=1.0,
    )
    table = [[r["agent"], r["tokens"], r["read"], f"{r['share'] * 100:.1f}"] for r in rows]
    return {
        "key": "cache",
        "title": title,
        "svg": svg,
        "heads": ["agent", "input tokens", "cache read", "share (%)"],
        "rows": table,
        "url": runs_url(**since),
    }


def _waiting_chart(runs: Any, w: Window) -> dict[str, Any]:
    data = overview_data.waiting(runs, w.now)
    queue = reverse("admin:agentrun_toolcall_changelist")
    links = {
        "awaiting_approval": queue + "?decision=approval",
        "unknown": queue + "?decision=unknown",
    }
    groups = [
        (
            label,
            [
                Bar(label, state, counts[state], links[state], f"{label}: {counts[state]} {state}")
                for state in WAITING_STATES
            ],
        )
        for label, counts in data["ages"]
    ]
    title = "Calls waiting for a person, by age"
    svg = charts.bars(
        title,
        "Tool calls waiting for an approval or for a person to settle an unknown outcome, "
        "by the time since the model asked for them (now, whatever the window).",
        groups,
        {"awaiting_approval": "#f08c00", "unknown": "#7048e8"},
    )
    table = [[label, *(counts[s] for s in WAITING_STATES)] for label, counts in data["ages"]]
    return {
        "key": "waiting",
        "title": title,
        "svg": svg,
        "heads": ["age", *WAITING_STATES],
        "rows": table,
        "url": runs_url(state__exact=RunState.AWAITING_APPROVAL),
        "oldest": [
            {
                "call": call,
                "url": reverse("admin:agentrun_toolcall_change", args=[call.pk]),
                "since": call.created_at,
            }
            for call in data["oldest"]
        ],
    }


def _failures_chart(runs: Any, w: Window) -> dict[str, Any]:
    rows = overview_data.failure_codes(runs, w)
    since = {"finished_at__gte": _iso(w.start)}
    groups = [
        (
            code or "(no code)",
            [
                Bar(
                    code,
                    "failed",
                    n,
                    runs_url(state__exact=RunState.FAILED, error_code=code, **since),
                    f"{code or '(no code)'}: {n} failed runs",
                )
            ],
        )
        for code, n in rows
    ]
    title = "Most frequent failure codes"
    svg = charts.bars(
        title, "Runs that failed in the window, by error code.", groups, {"failed": "#c92a2a"}
    )
    return {
        "key": "failures",
        "title": title,
        "svg": svg,
        "heads": ["error code", "failed runs"],
        "rows": [[code or "(no code)", n] for code, n in rows],
        "url": runs_url(state__exact=RunState.FAILED, **since),
    }
