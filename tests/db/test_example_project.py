"""The example project as a model to copy (issue 37): CSRF on every write a browser could be
made to send (a session's, and Basic credentials the browser keeps), the OpenAPI schema for
signed-in users only unless configured, and a way out for every user."""

from __future__ import annotations

import base64

import pytest
from django.test import Client
from django.urls import reverse

from django_agentrun.models import Run
from tests import factories

pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]


def basic(username: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:pw".encode()).decode()


def test_basic_auth__a_form_post_from_a_page_is_refused_json_is_not(no_broker):
    alice = factories.user("alice")
    run, _call, _model = factories.parked(alice)
    cancel = reverse("agentrun:run-cancel", args=[run.pk])
    browser = Client(enforce_csrf_checks=True)
    # What a page on another site can make a browser send with the credentials it keeps:
    # an empty form, or text/plain.
    for body, kind in (("", "application/x-www-form-urlencoded"), ("x", "text/plain")):
        refused = browser.post(cancel, body, content_type=kind, HTTP_AUTHORIZATION=basic("alice"))
        assert refused.status_code == 403, refused.content
        assert "CSRF" in refused.json()["detail"]
    assert Run.objects.get(pk=run.pk).state == "awaiting_approval"
    # A script sends JSON, as the API expects: no token needed.
    done = browser.post(
        cancel, {}, content_type="application/json", HTTP_AUTHORIZATION=basic("alice")
    )
    assert done.status_code == 200 and done.json()["state"] == "cancelled"


def test_schema__signed_in_users_only_unless_configured(client, settings):
    assert client.get("/api/schema/").status_code == 403
    client.force_login(factories.user("pat"))
    assert client.get("/api/schema/").status_code == 200


def test_logout__every_user_has_one(client):
    user = factories.user("demo", "start_run")  # not staff: no admin to log out from
    client.force_login(user)
    page = client.get("/chat/")
    assert page.status_code == 200
    assert f'action="{reverse("logout")}"'.encode() in page.content
    assert b'id="logout"' in page.content
    out = client.post(reverse("logout"))
    assert out.status_code == 302 and out["Location"] == "/accounts/login/"
    assert client.get("/chat/").status_code == 302  # signed out: to the login page
