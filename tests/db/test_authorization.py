"""Who may do what, tried live: every role against every operation of the API and the
admin's fork and resume (ROLES x OPERATIONS, the table below), with the project's default
start rule (`AGENTRUN_API_START = "agentrun.start_run"`). Each cell starts from a fresh
database: alice's runs and conversation, the acting user, one request, its status, and for
the operations that change something whether they did.

One rule decides who may begin a run of an agent (a start, a conversation, a message, a
fork, a resume, the admin's fork and resume); a fork is the requester's run, and another
user's run is not resumed by someone else (it would act with its owner's credentials); an
agent name is not confirmed to a user who may not start it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_agentrun import Agent, services, start_conversation, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.models import Conversation, Run
from django_agentrun.testing import ScriptedClient, error, reply, text
from tests import factories
from tests.conftest import assert_api_error, drive

pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

API = "/api/agentrun"

# role -> (permission codenames, is_staff, is_superuser); "owner" and "revoked" are alice,
# who owns the runs, with and without the start permission. Staff who see runs in the admin
# hold Django's view_run too.
ROLES: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "anonymous": ((), False, False),
    "owner": (("start_run",), False, False),
    "revoked": ((), False, False),
    "other": (("start_run",), False, False),
    "viewer": (("view_all_runs", "view_run"), True, False),
    "operator": (("view_all_runs", "view_run", "cancel_run", "start_run"), True, False),
    "canceller": (("view_all_runs", "view_run", "cancel_run"), True, False),
    "approver": (("view_all_runs", "view_run", "approve_toolcall"), True, False),
    "staff": ((), True, False),
    "hooks": (("manage_webhooks",), True, False),
    "root": ((), True, True),
}

# operation -> expected outcome per role, in ROLES' order. A status code; for the admin's
# pages (which answer with a redirect either way) "done", "refused" (the page says why and
# nothing changed), "login" (not staff: sent to the login page) or "404".
TABLE: dict[str, tuple[Any, ...]] = {
    #                  anon owner revoked other viewer operator canceller approver staff hooks root
    "start":          (403, 201, 403, 201, 403, 201, 403, 403, 403, 403, 201),
    "start-unknown":  (403, 403, 403, 403, 403, 403, 403, 403, 403, 403, 403),
    "list":           (403, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200),
    "retrieve":       (403, 200, 200, 404, 200, 200, 200, 200, 404, 404, 200),
    "events":         (403, 200, 200, 404, 200, 200, 200, 200, 404, 404, 200),
    "stream":         (403, 204, 204, 404, 204, 204, 204, 204, 404, 404, 204),
    "cancel":         (403, 200, 200, 404, 403, 200, 200, 403, 404, 404, 200),
    "resume":         (403, 200, 403, 404, 403, 403, 403, 403, 404, 404, 403),
    "fork":           (403, 201, 403, 404, 403, 201, 403, 403, 404, 404, 201),
    "pending":        (403, 403, 403, 403, 403, 403, 403, 200, 403, 403, 200),
    "approve":        (403, 403, 403, 403, 403, 403, 403, 200, 403, 403, 200),
    "conversation":   (403, 201, 403, 201, 403, 201, 403, 403, 403, 403, 201),
    "message":        (403, 201, 403, 404, 403, 403, 403, 403, 404, 404, 403),
    "stop":           (403, 200, 200, 404, 403, 200, 200, 403, 404, 404, 200),
    "schema":         (403, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200),
    "admin-fork":     ("login", "login", "login", "login", "refused", "done", "refused",
                       "refused", "404", "404", "done"),
    "admin-resume":   ("login", "login", "login", "login", "refused", "refused", "refused",
                       "refused", "404", "404", "refused"),
}  # fmt: skip
# A stream reads its user on threads of its own: its cells commit what they make.
CELLS = [
    pytest.param(op, role, marks=pytest.mark.django_db(transaction=True))
    if op == "stream"
    else (op, role)
    for op in TABLE
    for role in ROLES
]


@pytest.fixture
def world(settings, no_broker):
    """alice (who owns the runs), with the project's default start rule."""
    settings.AGENTRUN_API_START = "agentrun.start_run"
    return {"alice": factories.user("alice", "start_run")}


def acting(world: dict, role: str) -> User | None:
    if role == "anonymous":
        return None
    alice = world["alice"]
    if role in ("owner", "revoked"):
        if role == "revoked":
            alice.user_permissions.clear()
        return User.objects.get(pk=alice.pk)
    codenames, staff, superuser = ROLES[role]
    if superuser:
        return User.objects.create_superuser(role, password="pw")
    return factories.user(role, *codenames, is_staff=staff)


def client_for(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def post(client: Client, url: str, body: dict | None = None):
    return client.post(url, body or {}, content_type="application/json")


def completed(alice) -> Run:
    run = start_run("test-agent", "hello", owner=alice)
    drive(run, ScriptedClient([reply(text("Hello."))]))
    return run


# operation -> (client, alice, world) -> (status or outcome, whether it changed something)
def _start(client, alice, _):
    return post(client, f"{API}/runs/", {"agent": "test-agent", "input": "x"}).status_code


def _start_unknown(client, alice, _):
    return post(client, f"{API}/runs/", {"agent": "no-such-agent", "input": "x"}).status_code


def _get(path: Callable[[Run], str]):
    def do(client, alice, _):
        return client.get(path(completed(alice))).status_code

    return do


def _stream(client, alice, user):
    run = completed(alice)
    return client.get(f"{API}/runs/{run.pk}/stream/?after={run.last_seq}").status_code


def _cancel(client, alice, _):
    run, _call, _model = factories.parked(alice)
    response = post(client, f"{API}/runs/{run.pk}/cancel/")
    run.refresh_from_db()
    assert (run.state == "cancelled") == (response.status_code == 200)
    return response.status_code


def _resume(client, alice, _):
    run = factories.failed_run(alice)
    response = post(client, f"{API}/runs/{run.pk}/resume/")
    run.refresh_from_db()
    assert (run.state == "queued") == (response.status_code == 200)
    return response.status_code


def _fork(client, alice, user):
    run = completed(alice)
    response = post(client, f"{API}/runs/{run.pk}/fork/", {"turn": 0})
    forks = list(Run.objects.filter(forked_from=run))
    assert len(forks) == (response.status_code == 201)
    if forks:  # the requester's run: it acts with their credentials
        assert forks[0].owner_id == user.pk
    return response.status_code


def _pending(client, alice, _):
    factories.parked(alice)
    return client.get(f"{API}/tool-calls/pending/").status_code


def _approve(client, alice, _):
    run, call, _model = factories.parked(alice)
    token = services.approval_token(call)
    response = post(client, f"{API}/tool-calls/{call.pk}/approve/", {"token": token})
    call.refresh_from_db()
    assert (call.state != "awaiting_approval") == (response.status_code == 200)
    return response.status_code


def _conversation(client, alice, _):
    return post(client, f"{API}/conversations/", {"agent": "chat"}).status_code


def _message(client, alice, _):
    conversation = start_conversation("chat", owner=alice)
    response = post(client, f"{API}/conversations/{conversation.pk}/messages/", {"input": "Hi"})
    assert conversation.runs.count() == (response.status_code == 201)
    return response.status_code


def _stop(client, alice, _):
    conversation = start_conversation("chat", owner=alice)
    return post(client, f"{API}/conversations/{conversation.pk}/stop/").status_code


def _schema(client, alice, _):
    return client.get(f"{API}/schema/").status_code


def _admin(client, url: str, done: Callable[[], bool]) -> str:
    response = client.post(url, {"turn": 0}, follow=True)
    if response.status_code == 404:
        return "404"
    if response.redirect_chain and "/login/" in response.redirect_chain[0][0]:
        return "login"
    return "done" if done() else "refused"


def _admin_fork(client, alice, _):
    run = completed(alice)
    url = reverse("admin:agentrun_run_fork", args=[run.pk])
    return _admin(client, url, lambda: Run.objects.filter(forked_from=run).exists())


def _admin_resume(client, alice, _):
    run = factories.failed_run(alice)
    url = reverse("admin:agentrun_run_resume", args=[run.pk])
    return _admin(client, url, lambda: Run.objects.get(pk=run.pk).state == "queued")


OPERATIONS = {
    "start": _start,
    "start-unknown": _start_unknown,
    "list": lambda client, alice, _: client.get(f"{API}/runs/").status_code,
    "retrieve": _get(lambda run: f"{API}/runs/{run.pk}/"),
    "events": _get(lambda run: f"{API}/runs/{run.pk}/events/"),
    "stream": _stream,
    "cancel": _cancel,
    "resume": _resume,
    "fork": _fork,
    "pending": _pending,
    "approve": _approve,
    "conversation": _conversation,
    "message": _message,
    "stop": _stop,
    "schema": _schema,
    "admin-fork": _admin_fork,
    "admin-resume": _admin_resume,
}


def test_matrix__the_table_names_every_role_and_operation():
    assert set(TABLE) == set(OPERATIONS)
    assert all(len(row) == len(ROLES) for row in TABLE.values())
    assert len(CELLS) == 187


@pytest.mark.parametrize(("operation", "role"), CELLS)
def test_matrix(world, operation, role):
    user = acting(world, role)
    alice = world["alice"]
    expected = TABLE[operation][list(ROLES).index(role)]
    got = OPERATIONS[operation](client_for(user), alice, user)
    assert got == expected, (operation, role, got)


# --------------------------------------------------------------------------- one rule


def test_unknown_agents__answer_as_forbidden_ones_do(world):
    """A name is not confirmed to a user who may not start it: an unknown agent and one the
    user may not start get the same answer, word for word."""
    client = client_for(factories.user("pat"))  # no start permission
    for url in (f"{API}/runs/", f"{API}/conversations/"):
        known = post(client, url, {"agent": "test-agent", "input": "x"})
        unknown = post(client, url, {"agent": "test-agent-nope", "input": "x"})
        a = assert_api_error(known, 403, "permission_denied")
        b = assert_api_error(unknown, 403, "permission_denied")
        assert a["detail"].replace("test-agent", "N") == b["detail"].replace("test-agent-nope", "N")


@pytest.fixture
def owner_agent():
    """test-agent's tools, with runs that act for their owner (`run_as="owner"`)."""
    agent = Agent(name="for-owner", model="claude-sonnet-4-5", run_as="owner")
    yield agent
    unregister_agent(agent.name)


def test_run_as_owner__an_operator_resumes_and_forks_for_the_owner(world, owner_agent):
    alice = world["alice"]
    operator = factories.user("oscar", "view_all_runs", "cancel_run", "start_run")
    run = start_run(owner_agent, "hello", owner=alice)
    drive(run, ScriptedClient([reply(text("Hello."))]))
    client = client_for(operator)
    fork = post(client, f"{API}/runs/{run.pk}/fork/", {"turn": 0})
    assert fork.status_code == 201 and fork.json()["owner"] == alice.pk
    failed = start_run(owner_agent, "hello", owner=alice)
    refusal = ScriptedClient([error("bad request", retryable=False, status=400)] * 2)
    drive(failed, refusal)
    assert post(client, f"{API}/runs/{failed.pk}/resume/").status_code == 200
    drive(failed, refusal)
    # Acting for alice: once she may no longer start the agent, nobody does it for her.
    alice.user_permissions.clear()
    response = post(client, f"{API}/runs/{failed.pk}/resume/")
    assert "may no longer start" in assert_api_error(response, 403, "permission_denied")["detail"]


def test_a_message_after_the_owner_lost_the_permission__refused(world, no_broker):
    alice = world["alice"]
    conversation = start_conversation("chat", owner=alice)
    alice.user_permissions.clear()
    client = client_for(User.objects.get(pk=alice.pk))
    url = f"{API}/conversations/{conversation.pk}/messages/"
    refused = assert_api_error(post(client, url, {"input": "Hi"}), 403, "permission_denied")
    assert "agentrun.start_run" in refused["detail"]
    assert not Conversation.objects.get(pk=conversation.pk).runs.exists()


def test_agent__run_as_takes_requester_or_owner():
    from django_agentrun.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="run_as must be one of requester, owner"):
        Agent(name="bad-run-as", run_as="anyone", register=False)


# --------------------------------------------------------------------------- the hook's text


@pytest.fixture
def hooked():
    agent = Agent(
        name="hooked",
        model="claude-sonnet-4-5",
        api_start=True,
        context=lambda: "Internal: refunds over 50 EUR go to Mallory.",
    )
    yield agent
    unregister_agent(agent.name)


def test_context__the_hooks_text_is_the_authors_and_not_shown_to_clients(world, hooked):
    """The model reads the hook's text before the caller's; the API shows each viewer (the
    owner and whoever sees all runs) the caller's context only, as it shows no system prompt.
    The admin shows the whole run to staff."""
    alice = world["alice"]
    viewer = factories.user("vera", "view_all_runs")
    created = post(
        client_for(alice), f"{API}/runs/", {"agent": "hooked", "input": "x", "context": "Terse."}
    )
    assert created.status_code == 201
    run = Run.objects.get(pk=created.json()["id"])
    assert run.context == "Internal: refunds over 50 EUR go to Mallory.\n\nTerse."
    conversation = start_conversation("hooked", owner=alice)
    message = post(
        client_for(alice), f"{API}/conversations/{conversation.pk}/messages/", {"input": "Hi"}
    )
    for user in (alice, viewer):
        client = client_for(user)
        for run_id, shown in ((run.pk, "Terse."), (message.json()["id"], "")):
            detail = client.get(f"{API}/runs/{run_id}/").json()
            events = client.get(f"{API}/runs/{run_id}/events/").json()["results"]
            assert detail["context"] == shown
            assert events[0]["payload"].get("context", "") == shown
            assert "Mallory" not in json.dumps([detail, events])
    fork = post(client_for(alice), f"{API}/runs/{run.pk}/fork/", {"turn": 0}).json()
    assert fork["context"] == "Terse." and "Mallory" not in json.dumps(fork)
