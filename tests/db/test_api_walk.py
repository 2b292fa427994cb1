"""Every endpoint of the API, walked as a stranger, as another user and with bad ids:
the status, and the `{"code", "detail"}` body of every refusal."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from rest_framework.authentication import BasicAuthentication, SessionAuthentication

from django_agentrun import services, start_run
from django_agentrun.api.conversations import ConversationViewSet
from django_agentrun.api.views import RunViewSet, SchemaView, ToolCallViewSet
from django_agentrun.models import Run, RunEvent, ToolCall
from django_agentrun.testing import ScriptedClient, reply, tool_use
from tests import factories
from tests.conftest import assert_api_error, drive

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    # "run", "call", "conversation" or None: which object the URL names.
    target: str | None
    url: Callable[[str], str]
    body: Callable[[dict], dict] | None = None


def _run_url(kind: str) -> Callable[[str], str]:
    return lambda pk: reverse(f"agentrun:run-{kind}", args=[pk])


def _call_url(kind: str) -> Callable[[str], str]:
    return lambda pk: reverse(f"agentrun:toolcall-{kind}", args=[pk])


def _conversation_url(kind: str) -> Callable[[str], str]:
    return lambda pk: reverse(f"agentrun:conversation-{kind}", args=[pk])


ENDPOINTS = [
    Endpoint("list", "get", None, lambda _: reverse("agentrun:run-list")),
    Endpoint(
        "create",
        "post",
        None,
        lambda _: reverse("agentrun:run-list"),
        lambda ctx: {"agent": "test-agent", "input": "hi"},
    ),
    Endpoint("detail", "get", "run", _run_url("detail")),
    Endpoint("events", "get", "run", _run_url("events")),
    Endpoint("cancel", "post", "run", _run_url("cancel"), lambda ctx: {"reason": "x"}),
    Endpoint("resume", "post", "run", _run_url("resume"), lambda ctx: {}),
    Endpoint("fork", "post", "run", _run_url("fork"), lambda ctx: {"turn": 0}),
    Endpoint("pending", "get", None, lambda _: reverse("agentrun:toolcall-pending")),
    Endpoint("approve", "post", "call", _call_url("approve"), lambda ctx: {"token": ctx["token"]}),
    Endpoint(
        "reject",
        "post",
        "call",
        _call_url("reject"),
        lambda ctx: {"token": ctx["token"], "reason": "no"},
    ),
    Endpoint(
        "resolve",
        "post",
        "call",
        _call_url("resolve"),
        lambda ctx: {"token": ctx["token"], "action": "fail"},
    ),
    Endpoint("schema", "get", None, lambda _: reverse("agentrun:schema")),
    Endpoint("conversations", "get", None, lambda _: reverse("agentrun:conversation-list")),
    Endpoint(
        "start_conversation",
        "post",
        None,
        lambda _: reverse("agentrun:conversation-list"),
        lambda ctx: {"agent": "chat"},
    ),
    Endpoint("conversation", "get", "conversation", _conversation_url("detail")),
    Endpoint(
        "message",
        "post",
        "conversation",
        _conversation_url("messages"),
        lambda ctx: {"input": "hi"},
    ),
    Endpoint("stop", "post", "conversation", _conversation_url("stop"), lambda ctx: {}),
]
OBJECT_ENDPOINTS = [e for e in ENDPOINTS if e.target]
IDS = {e.name: e for e in ENDPOINTS}


def call(client: Client, endpoint: Endpoint, pk: str, ctx: dict):
    url = endpoint.url(pk)
    if endpoint.method == "get":
        return client.get(url)
    return client.post(url, endpoint.body(ctx), content_type="application/json")


@pytest.fixture
def alice(db) -> User:
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def objects(alice) -> dict:
    """Alice's run parked on an approval; "call" is that call, its token in "token"."""
    model = ScriptedClient([reply(tool_use("delete_account", {"user": "bob"}))])
    run = start_run("test-agent", "delete bob", owner=alice)
    drive(run, model)
    call = ToolCall.objects.get(run=run)
    conversation = services.start_conversation("chat", owner=alice)
    return {
        "run": str(run.pk),
        "call": str(call.pk),
        "token": services.approval_token(call),
        "conversation": str(conversation.pk),
    }


def _state(objects: dict) -> tuple:
    call = ToolCall.objects.select_related("run").get(pk=objects["call"])
    return call.state, call.run.state, RunEvent.objects.count(), Run.objects.count()


def _pk(endpoint: Endpoint, objects: dict) -> str:
    return objects[endpoint.target] if endpoint.target else ""


# --------------------------------------------------------------------------- (a) anonymous


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
def test_anonymous__403_not_authenticated_everywhere(objects, endpoint):
    before = _state(objects)
    assert_api_error(
        call(Client(), endpoint, _pk(endpoint, objects), objects), 403, "not_authenticated"
    )
    assert _state(objects) == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
def test_anonymous__401_everywhere_when_basic_auth_comes_first(objects, endpoint, monkeypatch):
    for view in (RunViewSet, ToolCallViewSet, SchemaView, ConversationViewSet):
        monkeypatch.setattr(
            view, "authentication_classes", [BasicAuthentication, SessionAuthentication]
        )
    response = call(Client(), endpoint, _pk(endpoint, objects), objects)
    assert_api_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == 'Basic realm="api"'


# --------------------------------------------------------------------------- (b) other users


@pytest.fixture
def mallory(db) -> Client:
    """Every action permission, but not agentrun.view_all_runs: sees only her own runs."""
    user = factories.user("mallory", "approve_toolcall", "cancel_run", is_staff=True)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("endpoint", OBJECT_ENDPOINTS, ids=lambda e: e.name)
def test_other_users_object__404_not_found(objects, mallory, endpoint):
    before = _state(objects)
    assert_api_error(call(mallory, endpoint, objects[endpoint.target], objects), 404, "not_found")
    assert _state(objects) == before


def test_other_users_objects__absent_from_collections(objects, mallory):
    for name in ("list", "pending", "conversations"):
        response = call(mallory, IDS[name], "", objects)
        assert response.status_code == 200 and response.json()["results"] == [], name
    assert call(mallory, IDS["schema"], "", objects).status_code == 200
    created = call(mallory, IDS["create"], "", objects)
    assert created.status_code == 201 and created.json()["owner"] != objects["run"]


# --------------------------------------------------------------------------- (c) bad ids

RUN_IDS = ["not-a-uuid", "123", "%00", str(uuid.UUID(int=0)), str(uuid.uuid4())]
CALL_IDS = ["abc", "1e3", "-1", "0", "%00", str(uuid.uuid4()), "999999", "9" * 25]


@pytest.fixture
def owner_client(alice) -> Client:
    alice.user_permissions.set(Permission.objects.filter(codename="approve_toolcall"))
    client = Client()
    client.force_login(User.objects.get(pk=alice.pk))
    return client


@pytest.mark.parametrize("endpoint", OBJECT_ENDPOINTS, ids=lambda e: e.name)
def test_bad_or_unknown_ids__404_not_found(objects, owner_client, endpoint):
    before = _state(objects)
    for pk in CALL_IDS if endpoint.target == "call" else RUN_IDS:
        url = endpoint.url("PK").replace("PK", pk)  # raw, as a client could send it
        if endpoint.method == "get":
            response = owner_client.get(url)
        else:
            response = owner_client.post(
                url, endpoint.body(objects), content_type="application/json"
            )
        assert_api_error(response, 404, "not_found")
    assert _state(objects) == before


def test_owner__every_endpoint_answers(objects, owner_client):
    """The same walk as the owner (who may decide): nothing above refused for a wrong reason."""
    statuses = {
        e.name: call(owner_client, e, _pk(e, objects), objects).status_code
        for e in ENDPOINTS
        if e.name not in ("approve", "reject", "resolve", "resume")
    }
    assert statuses == {
        "list": 200,
        "create": 201,
        "detail": 200,
        "events": 200,
        "cancel": 200,
        "fork": 201,
        "pending": 200,
        "schema": 200,
        "conversations": 200,
        "start_conversation": 201,
        "conversation": 200,
        "message": 201,
        "stop": 200,
    }
    # Cancelled: resuming works, and deciding on the cancelled call is a conflict.
    assert call(owner_client, IDS["resume"], objects["run"], objects).status_code == 200
    for name in ("approve", "reject"):
        assert_api_error(
            call(owner_client, IDS[name], objects["call"], objects), 409, "approval_error"
        )
    assert_api_error(
        call(owner_client, IDS["resolve"], objects["call"], objects), 409, "approval_error"
    )
