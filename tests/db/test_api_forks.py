"""`POST /runs/{id}/fork/`: who may fork (the owner, or agentrun.cancel_run on a run they
can see), what comes back, and every refusal as the API's one error body."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_agentrun.models import Run
from django_agentrun.states import RunState
from tests import factories
from tests.conftest import assert_api_error

pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]


def fork_url(run) -> str:
    return reverse("agentrun:run-fork", args=[run.pk])


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner(db):
    return factories.user("carol")


@pytest.fixture
def conversation(owner):
    return factories.conversation(owner=owner)[0]


def test_fork_api__the_owner_forks_from_a_turn(owner, conversation):
    client = client_for(owner)
    response = client.post(fork_url(conversation), {"turn": 2}, content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["forked_from"], body["forked_at_turn"]) == (str(conversation.pk), 2)
    assert body["state"] == RunState.QUEUED and body["owner"] == owner.pk
    assert [t["index"] for t in body["turns"]] == [0, 1]
    assert body["turns"][1]["tool_calls"][0]["source"] == "executed"
    events = client.get(reverse("agentrun:run-events", args=[body["id"]])).json()["results"]
    assert events[0]["payload"]["forked_from"] == str(conversation.pk)
    assert "config" not in events[0]["payload"]
    listed = client.get(reverse("agentrun:run-list")).json()["results"]
    assert {r["id"]: r["forked_from"] for r in listed}[body["id"]] == str(conversation.pk)


@pytest.mark.parametrize(
    ("codenames", "status", "code"),
    [
        ((), 404, "not_found"),  # another user's run: not even its existence
        (("approve_toolcall",), 404, "not_found"),
        (("view_all_runs",), 403, "permission_denied"),  # sees it, may not fork it
        (("cancel_run",), 404, "not_found"),  # may fork what they see, sees only their own
    ],
)
def test_fork_api__other_users(conversation, codenames, status, code):
    other = factories.user("dave", *codenames, is_staff=True)
    runs = Run.objects.count()
    response = client_for(other).post(
        fork_url(conversation), {"turn": 1}, content_type="application/json"
    )
    assert_api_error(response, status, code)
    assert Run.objects.count() == runs


def test_fork_api__an_operator_forks_someone_elses_run(conversation, owner):
    operator = factories.user("oscar", "cancel_run", "view_all_runs", is_staff=True)
    response = client_for(operator).post(
        fork_url(conversation), {"turn": 1}, content_type="application/json"
    )
    assert response.status_code == 201
    # The fork is the operator's: it acts with their credentials, not the owner's.
    assert response.json()["owner"] == operator.pk


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"turn": 9}, 400, "invalid", "no turn 9"),
        ({"turn": -1}, 400, "invalid", "greater than or equal to 0"),
        ({"turn": "two"}, 400, "invalid", "valid integer"),
        ({}, 400, "invalid", "required"),
        ({"turn": 4}, 409, "invalid_transition", "conversation ended"),
    ],
)
def test_fork_api__refusals(owner, conversation, body, status, code, says):
    runs = Run.objects.count()
    response = client_for(owner).post(fork_url(conversation), body, content_type="application/json")
    assert says in assert_api_error(response, status, code)["detail"]
    assert Run.objects.count() == runs


def test_fork_api__an_open_call_blocks_the_turns_after_it(owner):
    run, _, _ = factories.parked(owner)
    response = client_for(owner).post(fork_url(run), {"turn": 1}, content_type="application/json")
    assert "not closed" in assert_api_error(response, 409, "invalid_transition")["detail"]
