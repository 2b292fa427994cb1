"""Every error of the API has one body, `{"code", "detail"}` (plus `errors` for field
errors), through the real middleware stack and whatever the host's DRF settings say."""

from __future__ import annotations

import base64
import json

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from rest_framework.authentication import BasicAuthentication, SessionAuthentication

from django_agentrun import start_run
from django_agentrun.api.parsers import MAX_JSON_DEPTH
from django_agentrun.api.views import RunViewSet, ToolCallViewSet
from django_agentrun.models import Run, RunEvent
from tests import factories
from tests.conftest import assert_api_error

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

RUNS = reverse("agentrun:run-list")
PENDING = reverse("agentrun:toolcall-pending")
JSON = "application/json"


@pytest.fixture
def user(db) -> User:
    return factories.user("ann", "approve_toolcall")


@pytest.fixture
def web(user) -> Client:
    """Ann, logged in with a session, through every middleware; server errors answered."""
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def parked(user):
    run, call, _ = factories.parked(user)
    return run, call


def post(client: Client, url: str, body: str, **extra):
    return client.post(url, body, content_type=JSON, **extra)


# --------------------------------------------------------------------------- authentication


def test_anonymous__403_with_code_when_the_first_authenticator_has_no_challenge(db):
    # The example project puts SessionAuthentication first: DRF answers 403.
    body = assert_api_error(Client().get(RUNS), 403, "not_authenticated")
    assert "credentials" in body["detail"]


def test_anonymous__401_with_challenge_when_the_first_authenticator_has_one(db, monkeypatch):
    for view in (RunViewSet, ToolCallViewSet):
        monkeypatch.setattr(
            view, "authentication_classes", [BasicAuthentication, SessionAuthentication]
        )
    response = Client().get(RUNS)
    assert_api_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Basic")
    wrong = Client().get(RUNS, HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"ann:no").decode())
    assert_api_error(wrong, 401, "authentication_failed")


def test_permission_refusal__403_with_code(db, user):
    user.user_permissions.clear()
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))
    body = assert_api_error(client.get(PENDING), 403, "permission_denied")
    assert "agentrun.approve_toolcall" in body["detail"]


def test_cancel_refusal__403_permission_denied(parked, db):
    run, _ = parked
    watcher = factories.user("watcher", "view_all_runs")
    client = Client()
    client.force_login(watcher)
    response = post(client, reverse("agentrun:run-cancel", args=[run.pk]), "{}")
    body = assert_api_error(response, 403, "permission_denied")
    assert "agentrun.cancel_run" in body["detail"]
    assert Run.objects.get(pk=run.pk).state == "awaiting_approval"


def test_host_exception_handler__is_not_used(web, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "EXCEPTION_HANDLER": "tests.db.test_api_errors.host_handler",
    }
    assert_api_error(web.get(RUNS, {"state": "nope"}), 400, "invalid")
    assert_api_error(web.get(reverse("agentrun:run-detail", args=["x"])), 404, "not_found")


def host_handler(exc, context):  # pragma: no cover - must never be called
    raise AssertionError("the API's views use their own exception handler")


# --------------------------------------------------------------------------- 404


@pytest.mark.parametrize(
    "url",
    [
        "/api/agentrun/runs/not-a-uuid/",
        "/api/agentrun/runs/not-a-uuid/events/",
        "/api/agentrun/runs/a.b/",
        "/api/agentrun/runs/%00/",
        "/api/agentrun/runs/00000000-0000-0000-0000-000000000000/",
        "/api/agentrun/runs/00000000-0000-0000-0000-000000000000/events/",
    ],
)
def test_get_unknown_or_malformed_run_id__json_404(web, url):
    assert_api_error(web.get(url), 404, "not_found")


@pytest.mark.parametrize(
    "call_id", ["abc", "1.5", "-1", "0", "9" * 30, "%00", "%EF%BC%91", "99999999"]
)
@pytest.mark.parametrize("kind", ["approve", "reject", "resolve"])
def test_post_to_malformed_or_unknown_tool_call_id__json_404(web, parked, call_id, kind):
    response = post(web, f"/api/agentrun/tool-calls/{call_id}/{kind}/", "{}")
    assert_api_error(response, 404, "not_found")


def test_post_to_malformed_run_id__json_404(web):
    for kind in ("cancel", "resume"):
        assert_api_error(post(web, f"/api/agentrun/runs/nope/{kind}/", "{}"), 404, "not_found")


# --------------------------------------------------------------------------- 400 bodies


def test_validation_errors__one_shape_with_field_errors(web):
    body = assert_api_error(post(web, RUNS, "{}"), 400, "invalid")
    assert body["errors"] == {
        "agent": ["This field is required."],
        "input": ["This field is required."],
    }
    assert "agent: This field is required." in body["detail"]
    # An error about the body as a whole is under non_field_errors.
    listed = assert_api_error(post(web, RUNS, "[1, 2]"), 400, "invalid")
    assert list(listed["errors"]) == ["non_field_errors"]


@pytest.mark.parametrize(
    "body",
    [
        '{"agent": ',  # malformed
        "[" * 5000 + "]" * 5000,  # a RecursionError in Python's decoder
        "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),  # decodes, but too deep
        '{"agent": "test-agent", "input": "x", "metadata": {"n": 1e400}}',  # infinite
        '{"agent": "test-agent", "input": "x", "metadata": {"n": NaN}}',
        b'{"agent": "\xff"}',  # not UTF-8
    ],
)
def test_unusable_json__400_parse_error_and_nothing_created(web, parked, body):
    run, call = parked
    targets = [
        RUNS,
        reverse("agentrun:run-cancel", args=[run.pk]),
        reverse("agentrun:run-resume", args=[run.pk]),
        reverse("agentrun:toolcall-approve", args=[call.pk]),
        reverse("agentrun:toolcall-reject", args=[call.pk]),
        reverse("agentrun:toolcall-resolve", args=[call.pk]),
    ]
    events = RunEvent.objects.count()
    for url in targets:
        assert_api_error(post(web, url, body), 400, "parse_error")
    assert Run.objects.count() == 1 and RunEvent.objects.count() == events


@pytest.mark.parametrize(
    "body",
    [
        '{"agent": "test-agent", "input": "caf\\udce9"}',
        '{"agent": "test-agent", "input": [{"type": "text", "text": "\\ud800 bytes"}]}',
    ],
)
def test_input_that_cannot_be_sent__400_naming_the_input_and_nothing_created(web, body):
    """A lone surrogate is valid JSON and storable (the storage rule), but no request to
    the model can carry it: refused at the door, not failed on every attempt later."""
    body = assert_api_error(post(web, RUNS, body), 400, "invalid")
    assert "surrogate" in body["errors"]["input"][0]
    assert not Run.objects.exists()


def test_json_just_within_the_depth_limit__accepted(web):
    nested: object = "leaf"
    for _ in range(MAX_JSON_DEPTH - 2):  # the body and metadata are two levels
        nested = {"n": nested}
    body = json.dumps({"agent": "test-agent", "input": "x", "metadata": {"n": nested}})
    assert post(web, RUNS, body).status_code == 201


def test_body_over_data_upload_max_memory_size__413(web, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"agent": "test-agent", "input": "x" * 2000})
    assert_api_error(post(web, RUNS, body), 413, "request_too_large")
    assert not Run.objects.exists()


def test_unknown_format_or_accept__406(web):
    for params, accept in (
        ({"format": "xml"}, "*/*"),
        ({"format": "\x00"}, "*/*"),
        ({}, "text/csv"),
    ):
        for url in (RUNS, reverse("agentrun:schema")):
            assert_api_error(web.get(url, params, HTTP_ACCEPT=accept), 406, "not_acceptable")
    assert web.get(RUNS, {"format": "json"}).status_code == 200


def test_body_of_another_media_type__415(web):
    response = web.post(RUNS, "agent=test-agent", content_type="application/x-www-form-urlencoded")
    assert_api_error(response, 415, "unsupported_media_type")


def test_idempotency_key_header_with_nul__400(web):
    response = post(web, RUNS, '{"agent": "test-agent", "input": "x"}', HTTP_IDEMPOTENCY_KEY="a\0b")
    body = assert_api_error(response, 400, "invalid")
    assert "idempotency_key" in body["errors"]
    assert not Run.objects.exists()


# --------------------------------------------------------------------------- query parameters


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"agent": "a\x00b"}, "agent"),
        ({"state": "queued\x00"}, "state"),
        ({"state": "exploded"}, "state"),
        ({"page_size": "x"}, "page_size"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "-1"}, "page_size"),
        ({"page_size": "\x00"}, "page_size"),
    ],
)
def test_bad_list_parameters__400_naming_the_parameter(web, params, field):
    start_run("test-agent", "x", owner=User.objects.get(username="ann"))
    body = assert_api_error(web.get(RUNS, params), 400, "invalid")
    assert list(body["errors"]) == [field]


def test_huge_page_size__capped(web, user):
    start_run("test-agent", "x", owner=user)
    assert web.get(RUNS, {"page_size": "9" * 40}).status_code == 200


@pytest.mark.parametrize(
    "params",
    [
        {"after": "x"},
        {"after": "-1"},
        {"after": "\x00"},
        {"after": str(2**31)},
        {"after": "9" * 5000},  # int() would refuse this many digits
        {"limit": "0"},
        {"limit": "1.5"},
    ],
)
def test_bad_event_parameters__400(web, parked, params):
    run, _ = parked
    body = assert_api_error(
        web.get(reverse("agentrun:run-events", args=[run.pk]), params), 400, "invalid"
    )
    assert list(body["errors"]) == list(params)


def _cursor(query: str) -> str:
    return base64.b64encode(query.encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "zzz",
        "\x00",
        _cursor("p=garbage"),  # a position DRF would filter by: a 500 on the date
        _cursor("p=2024-01-01 00:00:00"),  # naive
        _cursor("p=0001-01-01 00:00:00%2B23:00"),  # out of range once in UTC
        _cursor("p=2024-01-01 00:00:00%00"),
        _cursor("o=-1"),
        _cursor("r=x"),
    ],
)
@pytest.mark.parametrize("url", [RUNS, PENDING])
def test_invalid_cursor__400_invalid_cursor(web, user, url, cursor):
    start_run("test-agent", "x", owner=user)
    assert_api_error(web.get(url, {"cursor": cursor}), 400, "invalid_cursor")


def test_valid_cursor_from_a_page__still_works(web, user):
    for i in range(3):
        start_run("test-agent", f"x{i}", owner=user)
    first = web.get(RUNS, {"page_size": 2}).json()
    second = web.get(first["next"]).json()
    assert len(second["results"]) == 1
    back = web.get(second["previous"]).json()
    assert [r["id"] for r in back["results"]] == [r["id"] for r in first["results"]]


# --------------------------------------------------------------------------- services


def test_service_refusal__keeps_its_code(web, parked):
    run, call = parked
    response = post(web, reverse("agentrun:run-resume", args=[run.pk]), "")
    body = assert_api_error(response, 409, "invalid_transition")
    assert "awaiting_approval" in body["detail"]
    stale = post(
        web,
        reverse("agentrun:toolcall-reject", args=[call.pk]),
        json.dumps({"token": "junk", "reason": "no"}),
    )
    assert_api_error(stale, 409, "invalid_token")
