"""The admin overview in headless Chromium at 1,400 px (nav sidebar open) on the test
database: a screenshot per window, nothing wider than the window, each chart's bars (their
values and tooltips, as the browser renders them) equal to a direct query of the rows, a
bar's link opens the run list it counts; at 700 px the charts shrink, the page does not
scroll sideways."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from tests import overview_seed
from tests.browser.test_console import fits, operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.no_projection_check]

OVERVIEW = "/admin/agentrun/run/overview/"
LABELS = ["under 1 h", "1-6 h", "6-24 h", "1-3 days", "over 3 days"]
BARS = """(key) => Array.from(document.querySelectorAll(`#chart-${key} svg rect[data-series]`))
  .map(r => ({label: r.dataset.label, series: r.dataset.series, value: Number(r.dataset.value),
              title: r.querySelector('title').textContent, href: r.parentElement.getAttribute('href'),
              width: r.getBoundingClientRect().width}))"""


def start_of(key: str, now: datetime) -> datetime:
    now = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return {
        "24h": now - timedelta(hours=23),
        "7d": now - timedelta(hours=167),
        "30d": now.replace(hour=0) - timedelta(days=29),
    }[key]


def shown(console, key: str) -> list[dict]:
    return console.page.evaluate(BARS, key)


@pytest.mark.parametrize("window", ["24h", "7d", "30d"])
def test_overview__charts_fit_and_equal_direct_queries(console, window):
    now = timezone.now()
    overview_seed.seed(now)
    operator("vera", "view_overview", "view_all_runs")
    console.login("vera")
    console.go(f"{OVERVIEW}?window={window}")
    assert console.page.locator("svg.agentrun-chart").count() == 7
    for details in console.page.locator("#content details").all():
        details.evaluate("(d) => d.open = true")  # the tables too must fit
    fits(console)
    console.shot(f"overview-{window}")
    start = start_of(window, now)

    runs = {(b["label"], b["series"]): int(b["value"]) for b in shown(console, "runs")}
    expected_runs = overview_seed.runs_by_state(start, "day" if window == "30d" else "hour")
    assert runs == expected_runs and sum(runs.values()) > 0
    for bar in shown(console, "runs"):
        assert bar["width"] > 0 and f": {int(bar['value'])} {bar['series']}" in bar["title"]

    cost = {(b["label"], b["series"]): b["value"] for b in shown(console, "cost") if b["value"]}
    expected_cost = overview_seed.cost_by_day(start)
    assert set(cost) == set(expected_cost)
    for key, value in expected_cost.items():
        assert cost[key] == pytest.approx(float(value), abs=1e-9)

    for key, expected in (
        ("turns", overview_seed.turn_latency(start)),
        ("tools", overview_seed.tool_latency(start)),
    ):
        figures: dict = {}
        for bar in shown(console, key):
            figures.setdefault(bar["label"], {})[bar["series"]] = bar["value"]
        assert set(figures) == set(expected), key
        for name, (_n, p50, p95) in expected.items():
            assert figures[name]["p50"] == pytest.approx(p50, abs=1e-6)
            assert figures[name]["p95"] == pytest.approx(p95, abs=1e-6)

    shares = {b["label"]: b["value"] for b in shown(console, "cache")}
    assert shares == pytest.approx(overview_seed.cache_share(start))
    for bar in shown(console, "cache"):
        assert re.search(r"\d+\.\d %", bar["title"]), bar

    codes = {b["label"]: int(b["value"]) for b in shown(console, "failures")}
    assert codes == overview_seed.failure_codes(start)

    waiting = {(b["label"], b["series"]): int(b["value"]) for b in shown(console, "waiting")}
    expected_waiting = {(LABELS[i], s): n for (i, s), n in overview_seed.waiting(now).items()}
    assert {k: v for k, v in waiting.items() if v} == expected_waiting


def test_overview__a_bar_opens_the_runs_it_counts(console):
    overview_seed.seed(timezone.now())
    operator("vera", "view_overview", "view_all_runs")
    console.login("vera")
    console.go(OVERVIEW + "?window=30d")
    bar = max(shown(console, "failures"), key=lambda b: b["value"])
    console.page.locator(f'#chart-failures a[href="{bar["href"]}"]').first.click()
    console.page.wait_for_selector("#result_list")
    rows = console.page.locator("#result_list tbody tr").count()
    assert rows == int(bar["value"])
    assert console.page.locator("#result_list tbody").inner_text().count("failed") == rows
    fits(console)


def test_overview__narrow_window_shrinks_the_charts(console):
    overview_seed.seed(timezone.now())
    operator("vera", "view_overview", "view_all_runs")
    page = console.login("vera")
    page.set_viewport_size({"width": 700, "height": 900})
    console.go(OVERVIEW)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    widths = page.evaluate(
        "Array.from(document.querySelectorAll('svg.agentrun-chart'))"
        ".map(s => s.getBoundingClientRect().right)"
    )
    assert widths and max(widths) <= 700
    console.shot("overview-700px")


def test_overview__without_the_permission(console):
    operator("pat", "view_all_runs")
    console.login("pat")
    assert console.go(OVERVIEW).status == 403
    console.go("/admin/agentrun/run/")
    assert console.page.locator("a", has_text="Overview").count() == 0
