"""System checks: each misconfiguration is reported with a hint."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from celery import Celery

from django_agentrun import Agent, Budget
from django_agentrun.agents import get_agent, unregister_agent
from django_agentrun.checks import (
    check_agents,
    check_api,
    check_celery,
    check_database,
    check_deployment,
    check_required_apps,
    check_settings,
)
from django_agentrun.deploy_checks import database_messages, longest_task_seconds
from django_agentrun.exceptions import UnknownAgent
from example_project.celery import app as project_app

# A URLconf without the API (settings.ROOT_URLCONF = __name__).
urlpatterns: list = []


def ids(messages):
    return {m.id for m in messages}


def test_checks__clean_project_has_no_findings():
    assert check_database() == []
    assert check_deployment() == []
    assert check_settings() == []
    assert check_celery() == []
    assert check_agents() == []
    assert check_required_apps() == []
    assert check_api() == []


@pytest.fixture
def current(monkeypatch) -> Iterator[Callable[[Celery], Celery]]:
    """Make a Celery app the current one for the test (the project's app again afterwards)."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)

    def make_current(app: Celery) -> Celery:
        app.set_current()
        return app

    yield make_current
    project_app.set_current()


def test_checks__no_celery_app_loaded_is_one_error_with_the_fix(current):
    # What Celery makes up when the project's __init__ never imports its celery.py.
    current(Celery("default", fixups=[], set_as_current=False))
    found = check_celery()
    assert ids(found) == {"agentrun.E010"}  # no advice about settings the app cannot see
    assert "tests/celery.py" in found[0].hint
    assert "from .celery import app as celery_app" in found[0].hint
    assert "config_from_object('django.conf:settings', namespace='CELERY')" in found[0].hint


def test_checks__app_not_configured_from_django_settings(current, settings):
    current(Celery("proj", set_as_current=False))  # its celery.py forgot config_from_object
    found = check_celery()
    # Prefetch and the beat schedule are set in Django settings: W001/W003 would be wrong.
    assert ids(found) == {"agentrun.E011"}
    assert "CELERY_WORKER_PREFETCH_MULTIPLIER" in found[0].msg
    assert "CELERY_BEAT_SCHEDULE" in found[0].msg
    assert "CELERY_BROKER_URL" in found[0].msg
    assert "namespace='CELERY'" in found[0].hint


def test_checks__app_overriding_a_django_setting(current, settings):
    app = current(configured_app())
    app.conf.worker_prefetch_multiplier = 4  # celery.py sets it again, differently
    found = check_celery()
    # The hint of W001 ("set CELERY_WORKER_PREFETCH_MULTIPLIER = 1") would not help here.
    assert ids(found) == {"agentrun.W013"}
    assert "CELERY_WORKER_PREFETCH_MULTIPLIER" in found[0].msg


def test_checks__broker_url_missing_and_connection_loss_setting(current, settings):
    del settings.CELERY_BROKER_URL
    settings.CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
    current(configured_app())
    found = check_celery()
    assert ids(found) == {"agentrun.W010", "agentrun.W011"}
    assert all(m.hint for m in found)


def test_checks__a_configured_project_app_is_clean(current):
    current(configured_app())
    assert check_celery() == []


def configured_app() -> Celery:
    """A project's Celery app configured the standard way, from the current settings."""
    app = Celery("proj", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    return app


def test_checks__prefetch_and_eager_and_missing_reaper(current, settings):
    settings.CELERY_WORKER_PREFETCH_MULTIPLIER = 4
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.CELERY_BEAT_SCHEDULE = {}
    current(configured_app())
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


@pytest.mark.parametrize(("lease", "refused"), [(1, True), (2, False), (3, False), (30, False)])
def test_checks__a_lease_too_short_to_be_renewed(settings, lease, refused):
    """With a 1 s lease the first renewal comes at 0.5 s, when the watchdog stops the step
    (a 2 s lease is renewed at 0.5 s and stopped at 1 s)."""
    settings.AGENTRUN_LEASE_SECONDS = lease
    found = [m for m in check_settings() if m.id == "agentrun.E006"]
    assert bool(found) is refused
    if refused:
        assert "too short to be renewed" in found[0].msg and "at least 2 seconds" in found[0].hint


@pytest.mark.parametrize(("rule", "refused"), [("start_run", True), (3, True), (True, False)])
def test_checks__api_start_setting_of_another_kind(settings, rule, refused):
    settings.AGENTRUN_API_START = rule
    assert ("agentrun.E007" in ids(check_settings())) is refused


def test_checks__governor_settings(settings):
    assert not {"agentrun.E014", "agentrun.E015", "agentrun.E016"} & ids(check_settings())
    settings.AGENTRUN_GOVERNOR_URL = "http://limits"
    settings.AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS = 60
    settings.AGENTRUN_FAIR_SHARE_KEY = "nowhere.tenant_of"
    assert {"agentrun.E014", "agentrun.E015", "agentrun.E016"} <= ids(check_settings())
    settings.AGENTRUN_GOVERNOR_URL = ""  # off
    settings.AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS = 0
    settings.AGENTRUN_FAIR_SHARE_KEY = None
    assert not {"agentrun.E014", "agentrun.E015", "agentrun.E016"} & ids(check_settings())


def test_checks__cost_budget_for_a_model_without_price():
    Agent(name="unpriced", model="some-other-model", budget=Budget(max_cost_usd=1))
    try:
        found = check_agents()
        assert ids(found) == {"agentrun.E004", "agentrun.W020"}
        assert "AGENTRUN_MODELS" in next(m for m in found if m.id == "agentrun.E004").hint
    finally:
        unregister_agent("unpriced")
    with pytest.raises(UnknownAgent):
        get_agent("unpriced")  # gone again: other tests see only their own agents


def test_checks__dated_model_ids_match_their_entry(settings):
    from django_agentrun.catalog import model_info

    assert model_info("claude-sonnet-4-5-20250929") == model_info("claude-sonnet-4-5")
    assert model_info("claude-sonnet-5-5-20261001").id == "claude-sonnet-5-5"
    # The deprecated AGENTRUN_PRICES still prices a model (and check says to move it).
    settings.AGENTRUN_PRICES = {
        "mine": {"input": 1, "output": 2, "cache_write": 1.5, "cache_read": 0.1}
    }
    prices = model_info("mine").prices
    assert (prices.output, prices.cache_write_5m) == (2, Decimal("1.5"))
    assert "agentrun.W021" in ids(check_agents())


def test_checks__api_without_authentication(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_AUTHENTICATION_CLASSES": []}
    found = check_api()
    assert ids(found) == {"agentrun.E013"}
    assert "DEFAULT_AUTHENTICATION_CLASSES" in found[0].hint


def test_checks__api_with_session_authentication_but_no_sessions(settings):
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if not m.endswith("AuthenticationMiddleware")
    ]
    found = check_api()
    assert ids(found) == {"agentrun.W012"}
    assert "AuthenticationMiddleware" in found[0].hint


def test_checks__api_checks_only_when_the_api_is_mounted(settings):
    settings.ROOT_URLCONF = __name__
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_AUTHENTICATION_CLASSES": []}
    assert check_api() == []


def test_checks__auth_and_contenttypes_are_required(settings):
    settings.INSTALLED_APPS = [
        a for a in settings.INSTALLED_APPS if a not in ("django.contrib.contenttypes",)
    ]
    found = check_required_apps()
    assert ids(found) == {"agentrun.E012"}
    assert "'django.contrib.contenttypes'" in found[0].hint


# --------------------------------------------------------------------------- deployment


def _pg(**entry):
    return {"ENGINE": "django.db.backends.postgresql", "NAME": "app", **entry}


def test_checks__a_pooler_without_disable_server_side_cursors():
    found = database_messages({"default": _pg(HOST="db", PORT=6432)})
    assert ids(found) == {"agentrun.W030"}
    assert "DISABLE_SERVER_SIDE_CURSORS'] = True" in found[0].hint
    assert ids(database_messages({"default": _pg(HOST="ep-x-pooler.neon.tech", PORT="5432")})) == {
        "agentrun.W030"
    }
    assert (
        database_messages({"default": _pg(HOST="db", PORT=6432, DISABLE_SERVER_SIDE_CURSORS=True)})
        == []
    )
    assert database_messages({"default": _pg(HOST="db", PORT=5432)}) == []  # a direct connection


def test_checks__server_side_binding_behind_a_pooler_needs_prepare_threshold_none():
    binding = {"server_side_binding": True}
    found = database_messages(
        {"default": _pg(PORT="6543", DISABLE_SERVER_SIDE_CURSORS=True, OPTIONS=binding)}
    )
    assert ids(found) == {"agentrun.W031"}
    assert "'prepare_threshold'] = None" in found[0].hint
    fixed = {**binding, "prepare_threshold": None}
    assert (
        database_messages(
            {"default": _pg(PORT="6543", DISABLE_SERVER_SIDE_CURSORS=True, OPTIONS=fixed)}
        )
        == []
    )
    # Django's own pool on a direct connection is fine as it is (big enough: W033).
    pool = {"pool": {"max_size": 8}, **binding}
    assert database_messages({"default": _pg(PORT=5432, OPTIONS=pool)}) == []


def test_checks__django_pool_smaller_than_what_a_worker_takes(settings):
    """A worker process takes up to AGENTRUN_TOOL_CONCURRENCY connections from Django's pool
    at once (the task's, and the other threads of a batch): the size deploy.md used to show
    (max_size 4) is too small for the default 8; the heartbeat's is outside the pool."""
    found = database_messages({"default": _pg(OPTIONS={"pool": {"min_size": 1, "max_size": 4}})})
    assert ids(found) == {"agentrun.W033"}
    assert "max_size 4" in found[0].msg
    assert "['max_size'] to at least 8" in found[0].hint
    # psycopg_pool's defaults (`True`: min_size 4, max_size = min_size) are as small.
    assert ids(database_messages({"default": _pg(OPTIONS={"pool": True})})) == {"agentrun.W033"}
    assert ids(database_messages({"default": _pg(OPTIONS={"pool": {"min_size": 8}})})) == set()
    assert database_messages({"default": _pg(OPTIONS={"pool": {"max_size": 8}})}) == []
    assert database_messages({"default": _pg()}) == []  # no pool
    settings.AGENTRUN_TOOL_CONCURRENCY = 4  # batches of at most 4: the task's and 3 more
    assert database_messages({"default": _pg(OPTIONS={"pool": {"max_size": 4}})}) == []
    settings.AGENTRUN_TOOL_CONCURRENCY = 6
    found = database_messages({"default": _pg(OPTIONS={"pool": {"max_size": 4}})})
    assert "at least 6" in found[0].hint


def test_checks__the_deprecated_prepared_statements_setting(settings):
    assert check_deployment() == []
    settings.AGENTRUN_PREPARED_STATEMENTS = False
    assert ids(check_deployment()) == {"agentrun.W032"}


def test_checks__visibility_timeout_shorter_than_the_longest_task(current, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    current(configured_app())
    assert check_celery() == []  # Redis's default (3600 s) is above the longest task
    longest = longest_task_seconds()
    assert longest == 30 + 300 * 4 + 30 * 3  # the defaults: TASK_SECONDS, ANTHROPIC_TIMEOUT...
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": longest - 1}
    found = check_celery_with(current)
    assert ids(found) == {"agentrun.W004"}
    assert "visibility_timeout" in found[0].hint
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": longest}
    assert check_celery_with(current) == []
    settings.AGENTRUN_ANTHROPIC_TIMEOUT = 1200  # a longer model call makes it short again
    assert ids(check_celery_with(current)) == {"agentrun.W004"}


def check_celery_with(current):
    current(configured_app())  # the app reads the settings as they are now
    return check_celery()


@pytest.mark.parametrize(
    ("limit", "refused"), [(0, False), (100_000, False), (-1, True), (1.5, True), ("10", True)]
)
def test_checks__wakeup_scan_limit(settings, limit, refused):
    settings.AGENTRUN_WAKEUP_SCAN_LIMIT = limit
    assert ("agentrun.E040" in ids(check_settings())) is refused
