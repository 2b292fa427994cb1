"""The rate-limit governor and parking with real Celery workers on Redis, against the
stand-in limited as the API limits an account (429 with retry-after and
anthropic-ratelimit-* headers): every run completes, no model step is answered twice,
and a 429 parks the run (its lease and slot given back) instead of sleeping in the slot."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.contrib.auth import get_user_model

from django_agentrun import start_run
from django_agentrun.models import Run
from django_agentrun.reaper import reap
from django_agentrun.testing.messages_api import AccountLimit, Reply, by_step, tool_use
from tests.processes import wait_for
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(240)

SCRIPT = by_step([Reply([tool_use("lookup", {"query": "q"})]), Reply("done")])
FAST = {"AGENTRUN_LEASE_SECONDS": "3", "AGENTRUN_QUEUED_STALE_SECONDS": "3"}


def _answered(api) -> Counter:
    """(run input, step) -> 200 answers."""
    answered: Counter = Counter()
    for record in api.requests:
        messages = (record.get("body") or {}).get("messages") or []
        if record.get("status") == 200 and messages:
            step = sum(1 for m in messages if m["role"] == "assistant")
            answered[(str(messages[0]["content"]), step)] += 1
    return answered


def _finish(ids: list, settings, timeout: float) -> None:
    settings.AGENTRUN_LEASE_SECONDS = 3
    settings.AGENTRUN_QUEUED_STALE_SECONDS = 3
    last = [0.0]

    def done() -> bool:
        if time.monotonic() - last[0] > 1:  # beat's reaper, every second
            last[0] = time.monotonic()
            reap(run_ids=ids)
        return Run.objects.filter(pk__in=ids, finished_at__isnull=False).count() == len(ids)

    wait_for(done, timeout=timeout, interval=0.1, message="runs not finished")


def test_governor__a_429_parks_the_run_instead_of_sleeping(workers, messages_api, settings):
    """Without the governor the account's limit answers 429: the run is parked (the lease
    and the slot given back, woken after retry-after), never retried inside the slot."""
    messages_api.script = SCRIPT
    messages_api.rate_limit = AccountLimit(0.5)  # one request, then one every 2 s
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 30  # an in-slot retry would show
    worker = workers.start(pool="prefork", concurrency=2, AGENTRUN_GOVERNOR_URL="", **FAST)
    ids = [start_run("test-agent", f"p{i}").pk for i in range(3)]
    _finish(ids, settings, timeout=120)
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    assert messages_api.rate_limit.refused > 0
    answered = _answered(messages_api)
    assert len(answered) == 6 and set(answered.values()) == {1}, answered
    assert len(executions("lookup")) == 3
    log = worker.tail(200_000)
    assert "Rate limited (429" in log and "parked for" in log
    assert "retrying in" not in log


def test_governor__every_worker_shares_the_limit_fairly(workers, messages_api, settings):
    """12 runs of one owner, then 2 of another, 3 requests a second for the account, two
    workers: every run completes, each model step answered once, every tool run once."""
    messages_api.script = SCRIPT
    messages_api.rate_limit = AccountLimit(3)
    broker = settings.CELERY_BROKER_URL  # the governor on the broker's Redis (the default)
    for _ in range(2):
        workers.start(pool="prefork", concurrency=2, AGENTRUN_GOVERNOR_URL=broker, **FAST)
    users = get_user_model().objects
    a, b = users.create(username="gov-a"), users.create(username="gov-b")
    ids = [start_run("test-agent", f"a{i}", owner=a).pk for i in range(12)]
    time.sleep(1)
    ids += [start_run("test-agent", f"b{i}", owner=b).pk for i in range(2)]
    _finish(ids, settings, timeout=180)
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    answered = _answered(messages_api)
    assert len(answered) == 28 and set(answered.values()) == {1}, answered
    assert len(executions("lookup")) == 14
    # The governor paces: few requests meet the account's limit.
    assert messages_api.rate_limit.refused <= 10, messages_api.rate_limit.refused


def test_caps__at_most_n_runs_of_a_key_are_worked_at_once(workers, messages_api, settings):
    """AGENTRUN_MAX_RUNS_PER_KEY = 1 on two workers of two processes each: owner A's six
    runs are worked one at a time, B's two beside them (a key's cap holds no other key
    back), every run completes, each model step is answered once, and the reaper (every
    second, a 3 s lease) takes no waiting run for a lost one."""
    from django.db.models.functions import Now

    messages_api.script = by_step(
        [Reply([tool_use("lookup", {"query": "q"})], latency=0.3), Reply("done", latency=0.3)]
    )
    capped = {"AGENTRUN_MAX_RUNS_PER_KEY": "1", "AGENTRUN_CAPPED_RETRY_SECONDS": "0.5"}
    for _ in range(2):
        workers.start(pool="prefork", concurrency=2, AGENTRUN_GOVERNOR_URL="", **FAST, **capped)
    users = get_user_model().objects
    a, b = users.create(username="cap-a"), users.create(username="cap-b")
    ids = [start_run("test-agent", f"a{i}", owner=a).pk for i in range(6)]
    ids += [start_run("test-agent", f"b{i}", owner=b).pk for i in range(2)]
    worked = Run.objects.filter(pk__in=ids, state__in=("running", "awaiting_tool")).exclude(
        lease_owner=""
    )
    most: Counter = Counter()
    both = False
    settings.AGENTRUN_LEASE_SECONDS = 3
    settings.AGENTRUN_QUEUED_STALE_SECONDS = 3
    reaped: list = []
    last = [time.monotonic()]

    def done() -> bool:
        nonlocal both
        if time.monotonic() - last[0] > 1:  # beat's reaper, every second
            last[0] = time.monotonic()
            reaped.extend(reap(run_ids=ids).findings)
        live = worked.filter(lease_expires_at__gt=Now())  # the database's clock
        counts = Counter(live.values_list("owner__username", flat=True))
        for owner, n in counts.items():
            most[owner] = max(most[owner], n)
        both = both or (counts["cap-a"] and counts["cap-b"])
        return Run.objects.filter(pk__in=ids, finished_at__isnull=False).count() == len(ids)

    wait_for(done, timeout=120, interval=0.02, message="runs not finished")
    assert set(Run.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    assert most == {"cap-a": 1, "cap-b": 1}, most
    assert both  # B's runs were worked beside A's, not behind them
    assert reaped == []  # a run waiting under a cap is no lost wake-up
    answered = _answered(messages_api)
    assert len(answered) == 16 and set(answered.values()) == {1}, answered
    log = workers.logs()
    assert "The cap of key owner:" in log and "is reached: waits" in log
