"""System checks: each misconfiguration is reported with a hint."""

from __future__ import annotations

from celery import current_app

from django_agentrun import Agent, Budget
from django_agentrun.agents import _registry
from django_agentrun.checks import check_agents, check_celery, check_database, check_settings


def ids(messages):
    return {m.id for m in messages}


def test_checks__clean_project_has_no_findings():
    assert check_database() == []
    assert check_settings() == []
    assert check_celery() == []
    assert check_agents() == []


def test_checks__prefetch_and_eager_and_missing_reaper(monkeypatch):
    monkeypatch.setitem(current_app.conf, "worker_prefetch_multiplier", 4)
    monkeypatch.setitem(current_app.conf, "task_always_eager", True)
    monkeypatch.setitem(current_app.conf, "beat_schedule", {})
    found = check_celery()
    assert ids(found) == {"agentrun.W001", "agentrun.W002", "agentrun.W003"}
    assert all(m.hint for m in found)
    assert "CELERY_WORKER_PREFETCH_MULTIPLIER = 1" in next(
        m.hint for m in found if m.id == "agentrun.W001"
    )


def test_checks__heartbeat_too_slow_and_bad_client(settings):
    settings.AGENTRUN_HEARTBEAT_SECONDS = 20
    settings.AGENTRUN_MODEL_CLIENT = "nowhere.Client"
    assert ids(check_settings()) == {"agentrun.E002", "agentrun.E003"}


def test_checks__cost_budget_for_a_model_without_price():
    Agent(name="unpriced", model="some-other-model", budget=Budget(max_cost_usd=1))
    try:
        found = check_agents()
        assert ids(found) == {"agentrun.E004"}
        assert "AGENTRUN_PRICES" in found[0].hint
    finally:
        _registry.pop("unpriced")


def test_checks__dated_model_ids_match_their_price(settings):
    from django_agentrun.conf import agentrun_settings

    assert agentrun_settings.price_for("claude-sonnet-4-5-20250929") == agentrun_settings.price_for(
        "claude-sonnet-4-5"
    )
    settings.AGENTRUN_PRICES = {
        "mine": {"input": 1, "output": 2, "cache_write": 1, "cache_read": 0.1}
    }
    assert agentrun_settings.price_for("mine")["output"] == 2
