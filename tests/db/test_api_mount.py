"""`include("django_agentrun.api.urls")` is all a host needs: renderers and the OpenAPI
schema work whatever its INSTALLED_APPS and REST_FRAMEWORK settings say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from drf_spectacular.validation import validate_schema
from rest_framework.throttling import SimpleRateThrottle

from django_agentrun.api.views import RunViewSet

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

ROOT = Path(__file__).resolve().parents[2]
RUNS = reverse("agentrun:run-list")
SCHEMA = reverse("agentrun:schema")
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.fixture
def web(db) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_user("ann", password="pw"))
    return client


# --------------------------------------------------------------------------- renderers


def test_browser__gets_the_browsable_api_when_rest_framework_is_installed(web):
    response = web.get(RUNS, HTTP_ACCEPT=BROWSER)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")


def test_browser__gets_json_without_rest_framework_in_installed_apps(web, settings):
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "rest_framework"]
    for url in (RUNS, reverse("agentrun:run-detail", args=["nope"])):
        response = web.get(url, HTTP_ACCEPT=BROWSER)
        assert response.status_code in (200, 404), response.content[:300]
        assert response["Content-Type"] == "application/json"


def test_browser__gets_json_when_the_host_turned_the_browsable_api_off(web, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    }
    response = web.get(RUNS, HTTP_ACCEPT=BROWSER)
    assert response.status_code == 200 and response["Content-Type"] == "application/json"


# --------------------------------------------------------------------------- the schema


def _paths(schema: dict) -> set[str]:
    return set(schema["paths"])


def test_schema__this_api_only_and_valid(web):
    response = web.get(SCHEMA)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    schema = response.json()
    validate_schema(schema)
    assert _paths(schema) == {
        "/api/agentrun/runs/",
        "/api/agentrun/runs/{id}/",
        "/api/agentrun/runs/{id}/events/",
        "/api/agentrun/runs/{id}/cancel/",
        "/api/agentrun/runs/{id}/resume/",
        "/api/agentrun/runs/{id}/fork/",
        "/api/agentrun/runs/{id}/stream/",
        "/api/agentrun/tool-calls/pending/",
        "/api/agentrun/tool-calls/{id}/approve/",
        "/api/agentrun/tool-calls/{id}/reject/",
        "/api/agentrun/tool-calls/{id}/resolve/",
        "/api/agentrun/conversations/",
        "/api/agentrun/conversations/{id}/",
        "/api/agentrun/conversations/{id}/messages/",
        "/api/agentrun/conversations/{id}/stop/",
        "/api/agentrun/conversations/{id}/stream/",
    }
    assert web.get(SCHEMA, {"format": "yaml"})["Content-Type"].startswith(
        "application/vnd.oai.openapi"
    )


def test_schema__needs_a_user_like_the_api(db):
    response = Client().get(SCHEMA)
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_authenticated"


def test_schema__with_empty_rest_framework_settings_and_no_drf_spectacular_app(web, settings):
    settings.REST_FRAMEWORK = {}  # DRF's own DEFAULT_SCHEMA_CLASS, which drf-spectacular refuses
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "drf_spectacular"]
    response = web.get(SCHEMA)
    assert response.status_code == 200, response.content[:500]
    validate_schema(response.json())
    assert "/api/agentrun/runs/" in response.json()["paths"]


def test_schema__every_operation_documents_its_error_statuses(web):
    schema = web.get(SCHEMA).json()
    error = {"$ref": "#/components/schemas/Error"}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            statuses = {int(code) for code in op["responses"]}
            expected = {401, 403, 406}
            if "{id}" in path:
                expected.add(404)
            if method == "post":
                expected |= {400, 413, 415}
            if path.endswith(("/runs/", "/pending/", "/events/", "/conversations/")):
                expected.add(400)  # filters, cursors, page sizes; a body
            if method == "post" and not path.endswith(("/runs/", "/conversations/", "/stop/")):
                expected.add(409)
            assert expected <= statuses, (method, path, sorted(statuses))
            for code in statuses - {200, 201, 204}:
                body = op["responses"][str(code)]["content"]["application/json"]["schema"]
                assert body == error, (method, path, code)
    for name in ("Approve", "Reject", "Resolve"):
        assert "token" in schema["components"]["schemas"][name]["required"], name


class OncePerMinute(SimpleRateThrottle):
    rate = "1/min"

    def get_cache_key(self, request, view):
        return "agentrun-test-throttle"


def test_throttled__429_documented_and_answered_when_the_host_throttles(web, monkeypatch):
    cache.delete("agentrun-test-throttle")
    assert "429" not in web.get(SCHEMA).json()["paths"]["/api/agentrun/runs/"]["get"]["responses"]
    monkeypatch.setattr(RunViewSet, "throttle_classes", [OncePerMinute])
    responses = web.get(SCHEMA).json()["paths"]["/api/agentrun/runs/"]["get"]["responses"]
    assert "429" in responses
    assert web.get(RUNS).status_code == 200
    throttled = web.get(RUNS)
    assert throttled.status_code == 429 and throttled.json()["code"] == "throttled"
    assert int(throttled["Retry-After"]) > 0
    cache.delete("agentrun-test-throttle")


# --------------------------------------------------------------------------- a bare host


BARE_SETTINGS = """
SECRET_KEY = "bare"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django_agentrun",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "bare_host_urls"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
CELERY_BROKER_URL = "memory://"
"""
BARE_URLS = """
from django.urls import include, path

urlpatterns = [path("agents/", include("django_agentrun.api.urls"))]
"""
BARE_SCRIPT = """
import json
import django

django.setup()
from django.core.management import call_command
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
call_command("migrate", verbosity=0)
client = Client(raise_request_exception=False)
client.force_login(User.objects.create_user("ann"))
schema = client.get("/agents/schema/")
page = client.get("/agents/runs/", HTTP_ACCEPT="text/html,*/*;q=0.8")
html_only = client.get("/agents/runs/", HTTP_ACCEPT="text/html")
print(json.dumps({
    "schema": [schema.status_code, schema["Content-Type"], sorted(schema.json().get("paths", {}))],
    "page": [page.status_code, page["Content-Type"]],
    "html_only": [html_only.status_code, html_only.json()["code"]],
}))
"""


def test_bare_host__no_rest_framework_apps_and_no_settings(tmp_path):
    """In a fresh process: what the views module does at import time must not depend on
    the host's DRF settings (no REST_FRAMEWORK at all here)."""
    (tmp_path / "bare_host_settings.py").write_text(BARE_SETTINGS)
    (tmp_path / "bare_host_urls.py").write_text(BARE_URLS)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "DJANGO_"))},
        "DJANGO_SETTINGS_MODULE": "bare_host_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BARE_SCRIPT)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    status, content_type, paths = result["schema"]
    assert (status, content_type) == (200, "application/json"), done.stderr[-3000:]
    assert "/agents/runs/{id}/events/" in paths and "/agents/schema/" not in paths
    assert result["page"] == [200, "application/json"]
    assert result["html_only"] == [406, "not_acceptable"]  # documented on every operation
