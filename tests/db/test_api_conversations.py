"""Conversations over the API: who may do what on every endpoint (the owner, another
user, staff with and without the permissions, a superuser, nobody), and what each endpoint
answers: a conversation with its status and runs, a message as a new run (its policy, its
Idempotency-Key), a stop, and a clear 4xx for every bad request."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_agentrun import send_message, start_conversation
from django_agentrun.models import Conversation, Run, RunEvent
from tests import factories
from tests.conftest import assert_api_error

# The surface (views, serializers, admin) runs the same on either Postgres driver.
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

LIST = reverse("agentrun:conversation-list")


def detail(pk) -> str:
    return reverse("agentrun:conversation-detail", args=[pk])


def messages(pk) -> str:
    return reverse("agentrun:conversation-messages", args=[pk])


def stop(pk) -> str:
    return reverse("agentrun:conversation-stop", args=[pk])


@pytest.fixture
def alice(db) -> User:
    return factories.user("alice")


@pytest.fixture
def conversation(alice) -> Conversation:
    """Alice's conversation, one message queued."""
    conversation = start_conversation("chat", owner=alice)
    send_message(conversation, "Hello.")
    return conversation


def login(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


USERS = {
    "owner": lambda alice: alice,
    "other": lambda alice: factories.user("bob"),
    # Staff, every permission but seeing all runs: as any other user.
    "staff": lambda alice: factories.user(
        "staff", "view_run", "cancel_run", "approve_toolcall", is_staff=True
    ),
    # Sees every conversation; may stop them; never speaks for their owner.
    "viewer": lambda alice: factories.user("viewer", "view_all_runs", is_staff=True),
    "operator": lambda alice: factories.user(
        "operator", "view_all_runs", "cancel_run", is_staff=True
    ),
    "superuser": lambda alice: User.objects.create_superuser("root", password="pw"),
    "anonymous": lambda alice: None,
}
# Expected status per user for: list (sees it?), create, detail, messages, stop.
MATRIX = {
    "owner": (True, 201, 200, 201, 200),
    "other": (False, 201, 404, 404, 404),
    "staff": (False, 201, 404, 404, 404),
    "viewer": (True, 201, 200, 403, 403),
    "operator": (True, 201, 200, 403, 200),
    "superuser": (True, 201, 200, 403, 200),
    "anonymous": (None, 403, 403, 403, 403),
}


@pytest.mark.parametrize("who", list(MATRIX))
def test_permissions__every_endpoint_for_every_kind_of_user(conversation, alice, who):
    user = USERS[who](alice)
    client = login(user)
    sees, create, get, post, halt = MATRIX[who]
    before = (Run.objects.count(), RunEvent.objects.count())

    listed = client.get(LIST)
    if sees is None:
        assert_api_error(listed, 403, "not_authenticated")
    else:
        assert listed.status_code == 200
        ids = [c["id"] for c in listed.json()["results"]]
        assert (str(conversation.pk) in ids) is sees

    got = client.get(detail(conversation.pk))
    assert got.status_code == get, got.content[:200]
    sent = client.post(messages(conversation.pk), {"input": "Hi."}, content_type="application/json")
    assert sent.status_code == post, sent.content[:200]
    if post != 201:
        assert (Run.objects.count(), RunEvent.objects.count()) == before  # nothing written
    stopped = client.post(stop(conversation.pk), {}, content_type="application/json")
    assert stopped.status_code == halt, stopped.content[:200]
    for response, status in ((got, get), (sent, post), (stopped, halt)):
        if status >= 400:
            code = {403: "permission_denied", 404: "not_found"}[status]
            assert_api_error(response, status, "not_authenticated" if user is None else code)
    if halt != 200:
        assert conversation.runs.filter(state="cancelled").count() == 0

    made = client.post(LIST, {"agent": "chat"}, content_type="application/json")
    assert made.status_code == create, made.content[:200]
    if create == 201:
        assert made.json()["owner"] == user.pk


def test_create__a_conversation_with_its_snapshot_policy_and_status(alice):
    client = login(alice)
    response = client.post(
        LIST,
        {"agent": "chat", "policy": "interrupt", "metadata": {"ticket": 7}},
        content_type="application/json",
    )
    assert response.status_code == 201
    body = response.json()
    assert (body["agent"], body["policy"], body["status"], body["runs"]) == (
        "chat",
        "interrupt",
        "idle",
        [],
    )
    assert body["metadata"] == {"ticket": 7} and body["model"] == "claude-sonnet-4-5"
    assert "config" not in body  # the system prompt and tools stay server-side
    assert Conversation.objects.get(pk=body["id"]).config["system"] == "You are a chat agent."


def test_messages__start_runs_in_order_shown_on_the_conversation(conversation, alice):
    client = login(alice)
    response = client.post(
        messages(conversation.pk),
        {"input": "And then?", "context": "Today is Friday."},
        content_type="application/json",
    )
    assert response.status_code == 201
    run = response.json()
    assert (run["conversation"], run["conversation_position"], run["state"]) == (
        str(conversation.pk),
        1,
        "queued",
    )
    assert run["owner"] == alice.pk
    shown = client.get(detail(conversation.pk)).json()
    assert shown["status"] == "busy"
    assert [(r["conversation_position"], r["input"], r["context"]) for r in shown["runs"]] == [
        (0, "Hello.", ""),
        (1, "And then?", "Today is Friday."),
    ]


def test_messages__idempotency_key_header_returns_the_first_run(conversation, alice):
    client = login(alice)
    post = lambda body, **headers: client.post(  # noqa: E731
        messages(conversation.pk), body, content_type="application/json", **headers
    )
    first = post({"input": "Once."}, HTTP_IDEMPOTENCY_KEY="msg-1")
    again = post({"input": "Once."}, HTTP_IDEMPOTENCY_KEY="msg-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert conversation.runs.count() == 2
    assert_api_error(
        post({"input": "Another."}, HTTP_IDEMPOTENCY_KEY="msg-1"), 422, "idempotency_key_reused"
    )
    body = assert_api_error(
        post({"input": "x", "idempotency_key": "a"}, HTTP_IDEMPOTENCY_KEY="b"), 400, "invalid"
    )
    assert "idempotency_key" in body["errors"]


def test_messages__reject_policy_answers_409_while_busy(conversation, alice):
    response = login(alice).post(
        messages(conversation.pk),
        {"input": "Now!", "policy": "reject"},
        content_type="application/json",
    )
    assert_api_error(response, 409, "conversation_busy")
    assert conversation.runs.count() == 1


def test_stop__cancels_and_shows_the_conversation_interrupted(conversation, alice):
    response = login(alice).post(
        stop(conversation.pk), {"reason": "enough"}, content_type="application/json"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "interrupted"
    assert [r["state"] for r in body["runs"]] == ["cancelled"]


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("list", {"agent": "chat", "policy": "later"}, "policy"),
        ("list", {"agent": "chat", "metadata": [1]}, "metadata"),
        ("messages", {}, "input"),
        ("messages", {"input": ""}, "input"),
        ("messages", {"input": [{"type": "thinking", "thinking": "x"}]}, "input"),
        ("messages", {"input": "x", "policy": "whenever"}, "policy"),
        ("messages", {"input": "x", "context": ["a"]}, "context"),
        ("messages", {"input": "x", "context": "a\u0000b"}, "context"),  # a text column
        ("messages", {"input": "x", "metadata": "m"}, "metadata"),
    ],
)
def test_bad_requests__400_naming_the_field(conversation, alice, url, body, field):
    target = LIST if url == "list" else messages(conversation.pk)
    response = login(alice).post(target, body, content_type="application/json")
    errors = assert_api_error(response, 400, "invalid")["errors"]
    assert field in errors, errors


def test_bad_ids_and_queries__404_and_400(conversation, alice):
    client = login(alice)
    for pk in ("nope", "123", "00000000-0000-0000-0000-000000000000"):
        assert_api_error(client.get(detail(pk)), 404, "not_found")
        assert_api_error(
            client.post(messages(pk), {"input": "x"}, content_type="application/json"),
            404,
            "not_found",
        )
    assert_api_error(client.get(LIST, {"page_size": "0"}), 400, "invalid")
    assert_api_error(client.get(LIST, {"cursor": "!!"}), 400, "invalid_cursor")
    assert [c["id"] for c in client.get(LIST, {"agent": "chat"}).json()["results"]] == [
        str(conversation.pk)
    ]
    assert client.get(LIST, {"agent": "other"}).json()["results"] == []


def test_list__one_query_for_the_page_whatever_its_length(alice, django_assert_max_num_queries):
    for n in range(6):
        conversation = start_conversation("chat", owner=alice)
        for m in range(n % 3):
            send_message(conversation, f"Message {m}.")
    client = login(alice)
    # Session, user, permissions (user, group), the page with its statuses.
    with django_assert_max_num_queries(5):
        page = client.get(LIST).json()["results"]
    assert [c["status"] for c in page] == ["busy", "busy", "idle"] * 2


def test_messages__to_a_conversation_whose_agent_is_gone_400(alice):
    from django_agentrun import Agent
    from django_agentrun.agents import unregister_agent

    Agent(name="gone", system="Soon gone.")
    conversation = start_conversation("gone", owner=alice)
    unregister_agent("gone")
    response = login(alice).post(
        messages(conversation.pk), {"input": "Hi."}, content_type="application/json"
    )
    assert_api_error(response, 400, "unknown_agent")
    assert conversation.runs.count() == 0
