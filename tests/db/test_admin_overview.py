"""The admin overview: only for staff with `agentrun.view_overview`; each chart's numbers
equal a direct query of the rows (tests/overview_seed.py) in every window; its links open
the run list filtered to what a bar counts; a bad window is a clear 400, never a 500."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html import unescape
from pathlib import Path

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_agentrun.admin import overview_data
from django_agentrun.admin.overview_data import percentile
from django_agentrun.models import Run
from django_agentrun.states import RunState
from tests import factories, overview_seed

# The rows are written directly (tests/overview_seed.py), as a year of history would be
# loaded, without events: there is nothing for the projection check to rebuild.
# The overview's queries are the ORM's own: the same on any driver and binding.
pytestmark = [pytest.mark.django_db, pytest.mark.no_projection_check, pytest.mark.one_driver]

OVERVIEW = reverse("admin:agentrun_run_overview")
GOLDEN = Path(__file__).with_name("golden") / "overview_figures.json"
RUNS = reverse("admin:agentrun_run_changelist")
VIEW = ("view_run", "view_toolcall", "view_runevent")
BAR = re.compile(
    r'<a href="([^"]*)"><rect [^>]*data-label="([^"]*)" data-series="([^"]*)" '
    r'data-value="([^"]*)"'
)


def start_of(key: str, now: datetime) -> datetime:
    now = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return {
        "24h": now - timedelta(hours=23),
        "7d": now - timedelta(hours=167),
        "30d": now.replace(hour=0) - timedelta(days=29),
    }[key]


def section(page: str, key: str) -> str:
    found = re.search(rf'<section [^>]*id="chart-{key}".*?</section>', page, re.S)
    assert found, key
    return found.group(0)


def bars(page: str, key: str) -> list[tuple[str, str, str, float]]:
    return [
        (unescape(url), unescape(label), unescape(series), float(value))
        for url, label, series, value in BAR.findall(section(page, key))
    ]


@pytest.fixture
def staff(client):
    user = factories.user("vera", *VIEW, "view_overview", "view_all_runs", is_staff=True)
    client.force_login(user)
    return user


@pytest.fixture
def seeded():
    now = timezone.now()
    overview_seed.seed(now)
    return now


def test_overview__needs_the_permission(client):
    client.force_login(factories.user("pat", *VIEW, "view_all_runs", is_staff=True))
    assert client.get(OVERVIEW).status_code == 403
    assert "Overview" not in client.get(RUNS).text


def test_overview__needs_staff(client):
    client.force_login(factories.user("sam", *VIEW, "view_overview"))  # not staff
    response = client.get(OVERVIEW)
    assert response.status_code == 302 and "/login/" in response["Location"]
    client.logout()
    assert client.get(OVERVIEW).status_code == 302


@pytest.mark.parametrize(
    "query",
    ["finished_at__gte=nope", "finished_at__lt=2026-13-45", "error_code=%00", "state__exact=zzz"],
)
def test_overview__bad_link_parameters_never_answer_500(client, staff, query):
    response = client.get(f"{RUNS}?{query}", follow=True)
    assert response.status_code == 200, response.status_code
    if "finished_at" in query or "%00" in query:
        assert response.redirect_chain and "the list is shown unfiltered" in response.text


def test_overview__a_link_says_what_it_filters(client, staff, seeded):
    page = client.get(f"{RUNS}?finished_at__gte=2026-01-01T00:00:00%2B00:00&error_code=x").text
    assert "Runs finished from 2026-01-01T00:00:00+00:00; error code x" in page
    assert "agentrun-overview-filters" not in client.get(RUNS).text


def test_overview__linked_from_the_run_list(client, staff):
    assert f'href="{OVERVIEW}"' in client.get(RUNS).text


@pytest.mark.parametrize("window", ["1y", "", "7d'><script>", "x" * 300])
def test_overview__bad_window_is_a_clear_400(client, staff, window):
    response = client.get(OVERVIEW, {"window": window or " "})
    assert response.status_code == 400
    assert "choose one of 24h, 7d, 30d" in response.text
    assert "<script>" not in response.text


def test_overview__empty_database(client, staff):
    for window in ("24h", "7d", "30d"):
        response = client.get(OVERVIEW, {"window": window})
        assert response.status_code == 200
        assert response.text.count('class="agentrun-chart"') == 7


@pytest.mark.parametrize("window", ["24h", "7d", "30d"])
def test_overview__runs_per_bucket_equal_a_direct_query(client, staff, seeded, window):
    page = client.get(OVERVIEW, {"window": window}).text
    unit = "day" if window == "30d" else "hour"
    expected = overview_seed.runs_by_state(start_of(window, seeded), unit)
    shown = {(label, series): int(value) for _u, label, series, value in bars(page, "runs")}
    assert shown == expected and sum(expected.values()) > 0


@pytest.mark.parametrize("window", ["24h", "7d", "30d"])
def test_overview__cost_per_day_equals_a_direct_query(client, staff, seeded, window):
    page = client.get(OVERVIEW, {"window": window}).text
    expected = overview_seed.cost_by_day(start_of(window, seeded))
    shown = {(label, series): value for _u, label, series, value in bars(page, "cost") if value}
    assert set(shown) == set(expected)
    for key, cost in expected.items():
        assert shown[key] == pytest.approx(float(cost), abs=1e-9)
    table = re.findall(
        r"<tr><td>([\d-]+)</td><td>([^<]+)</td><td>([\d.]+)</td></tr>", section(page, "cost")
    )
    assert {(d, a): Decimal(c) for d, a, c in table} == expected


@pytest.mark.parametrize("window", ["24h", "30d"])
def test_overview__latency_equals_a_direct_query(client, staff, seeded, window):
    page = client.get(OVERVIEW, {"window": window}).text
    start = start_of(window, seeded)
    for key, expected in (
        ("turns", overview_seed.turn_latency(start)),
        ("tools", overview_seed.tool_latency(start)),
    ):
        shown: dict = {}
        for _u, label, series, value in bars(page, key):
            shown.setdefault(label, {})[series] = value
        assert set(shown) == set(expected)
        for name, (_n, p50, p95) in expected.items():
            assert shown[name]["p50"] == pytest.approx(p50, abs=1e-6), (key, name)
            assert shown[name]["p95"] == pytest.approx(p95, abs=1e-6), (key, name)
    if connection.vendor == "postgresql":  # and Postgres's own percentile_cont agrees
        own = overview_seed.postgres_percentiles(
            "agentrun_turn", "model", start, "state = 'completed'"
        )
        for name, (p50, p95) in own.items():
            assert overview_seed.turn_latency(start)[name][1:] == pytest.approx((p50, p95))


@pytest.mark.parametrize("window", ["7d", "30d"])
def test_overview__cache_share_and_failures_equal_a_direct_query(client, staff, seeded, window):
    page = client.get(OVERVIEW, {"window": window}).text
    start = start_of(window, seeded)
    shares = {label: value for _u, label, _s, value in bars(page, "cache")}
    assert shares == pytest.approx(overview_seed.cache_share(start))
    codes = {label: int(value) for _u, label, _s, value in bars(page, "failures")}
    assert codes == overview_seed.failure_codes(start) and codes


def test_overview__waiting_calls_by_age(client, staff, seeded):
    page = client.get(OVERVIEW).text
    shown = {
        (label, series): int(value) for _u, label, series, value in bars(page, "waiting") if value
    }
    labels = ["under 1 h", "1-6 h", "6-24 h", "1-3 days", "over 3 days"]
    expected = {(labels[i], state): n for (i, state), n in overview_seed.waiting(seeded).items()}
    assert shown == expected and sum(expected.values()) == 5
    assert section(page, "waiting").count("waiting since") == 5


def test_overview__links_open_the_filtered_run_list(client, staff, seeded):
    page = client.get(OVERVIEW, {"window": "30d"}).text
    for key in ("runs", "cost", "failures"):
        for url, _label, _series, value in bars(page, key)[:40]:
            if not value or not url.startswith(RUNS):
                continue
            listed = client.get(url)
            assert listed.status_code == 200, url
            count = re.search(r"(\d+) runs?\b", listed.text)
            if key == "runs":
                assert count and int(count.group(1)) == int(value), url
    failed = [b for b in bars(page, "failures")][0]
    listed = client.get(failed[0])
    code = failed[1]
    assert int(re.search(r"(\d+) runs?\b", listed.text).group(1)) == int(failed[3])
    assert Run.objects.filter(state=RunState.FAILED, error_code=code).exists()


def test_overview__counts_only_the_runs_the_user_sees(client, seeded):
    mine = factories.user("own", *VIEW, "view_overview", is_staff=True)
    overview_seed.seed(seeded, runs=6, seed_value=3, owner=mine)
    client.force_login(mine)
    page = client.get(OVERVIEW, {"window": "30d"}).text
    total = sum(int(v) for _u, _l, _s, v in bars(page, "runs"))
    finished = Run.objects.filter(owner=mine, finished_at__isnull=False).count()
    assert 0 < total <= finished < Run.objects.filter(finished_at__isnull=False).count()


def test_percentile__matches_percentile_cont():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)


def test_overview__latency_over_the_latest_rows_of_a_busy_window(
    client, staff, seeded, monkeypatch
):
    monkeypatch.setattr(overview_data, "LATENCY_SAMPLE", 10)
    page = client.get(OVERVIEW, {"window": "30d"}).text
    start = start_of("30d", seeded)
    ends = sorted((end for _m, _s, end in overview_seed.latency_rows("turns", start)), reverse=True)
    cut = ends[9]
    expected = overview_seed.turn_latency(cut)
    shown: dict = {}
    for _u, label, series, value in bars(page, "turns"):
        shown.setdefault(label, {})[series] = value
    assert set(shown) == set(expected) and expected["all"][0] == 10
    for name, (_n, p50, p95) in expected.items():
        assert (shown[name]["p50"], shown[name]["p95"]) == pytest.approx((p50, p95))
    assert "Over the latest 10 of the window: since" in section(page, "turns")


def test_overview__the_same_figures_as_before_the_run_table_changed():
    """The seed's rows at a fixed time give the figures the page gave before issue #38
    (the overview's runs read through agentrun_run_finished_at_idx and their rows, no
    longer from the keys of an index-only scan): tests/db/golden/overview_figures.json,
    computed on main before the change (`AGENTRUN_UPDATE_GOLDEN=1` writes it again)."""
    now = datetime(2026, 11, 20, 15, 37, 12, tzinfo=UTC)
    overview_seed.seed(now)
    figures = json.loads(json.dumps(overview_seed.page_figures(now)))
    if os.environ.get("AGENTRUN_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.exists(), "no golden file: run with AGENTRUN_UPDATE_GOLDEN=1"
    golden = json.loads(GOLDEN.read_text())
    assert golden["30d"]["runs_by_state"] and golden["waiting"]["oldest"]
    assert figures == golden
