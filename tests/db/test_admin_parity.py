"""The admin and the API give the same answers to the same users: who sees a run (its
page, its calls, its events, its values), who decides on its calls (one by one and in
bulk), who cancels, resumes and forks it. One rule, walked on both surfaces:

- sees: a superuser, a user with agentrun.view_all_runs, or the run's owner;
- decides: sees it, and has agentrun.approve_toolcall (or is a superuser);
- cancels, forks: sees it, and owns it or has agentrun.cancel_run (and, for a fork, the
  agent's start rule: any signed-in user in these settings);
- resumes: sees it, and owns it (resumed, another user's run would act with its owner's
  credentials: tests/db/test_authorization.py).

The admin needs a staff user with the app's view permissions besides; for anyone else
(anonymous, a user who is not staff) it answers nothing at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.messages import get_messages
from django.db import transaction
from django.test import Client
from django.urls import reverse

from django_agentrun import services
from django_agentrun.models import Run, ToolCall
from tests import factories

pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

VIEW = ("view_run", "view_toolcall", "view_runevent")
USERS: dict[str, tuple[tuple[str, ...], dict]] = {
    "alice": (VIEW, {"is_staff": True}),  # owns run "a"
    "bob": ((), {}),  # owns run "b"; not staff
    "stranger": (VIEW, {"is_staff": True}),
    "approver": ((*VIEW, "approve_toolcall"), {"is_staff": True}),
    "approver_all": ((*VIEW, "approve_toolcall", "view_all_runs"), {"is_staff": True}),
    "viewer_all": ((*VIEW, "view_all_runs"), {"is_staff": True}),
    "operator": ((*VIEW, "cancel_run", "view_all_runs"), {"is_staff": True}),
    "owner_approver": ((*VIEW, "approve_toolcall"), {"is_staff": True}),  # owns run "c"
}
OWNERS = {"a": "alice", "b": "bob", "c": "owner_approver"}
ANSWERS = (
    "sees",
    "events",
    "decides",
    "bulk_decides",
    "rejects",
    "resolves",
    "cancels",
    "resumes",
    "forks",
)
# Per run of the world, a run of the same owner parked on an unknown outcome: its call.
UNKNOWNS: dict = {}


@pytest.fixture
def world(db, monkeypatch):
    users = {name: factories.user(name, *perms, **extra) for name, (perms, extra) in USERS.items()}
    users["root"] = User.objects.create_superuser("root", password="pw")
    users["anonymous"] = AnonymousUser()
    runs = {key: factories.parked(users[owner])[0] for key, owner in OWNERS.items()}
    UNKNOWNS.clear()
    for run in runs.values():
        UNKNOWNS[run.pk] = factories.unknown(monkeypatch, run.owner)[1]
    return users, runs


def rule(user, run: Run) -> dict[str, bool]:
    sees = bool(
        user.is_authenticated
        and (
            user.is_superuser or user.has_perm("agentrun.view_all_runs") or run.owner_id == user.pk
        )
    )
    decides = sees and user.has_perm("agentrun.approve_toolcall")
    acts = sees and (run.owner_id == user.pk or user.has_perm("agentrun.cancel_run"))
    return {
        "sees": sees,
        "events": sees,
        "decides": decides,
        "bulk_decides": decides,
        "rejects": decides,
        "resolves": decides,
        "cancels": acts,
        "resumes": acts and run.owner_id == user.pk,
        "forks": acts,
    }


def uses_admin(user) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("agentrun.view_run"))


def rolled_back(check: Callable[[], bool]) -> bool:
    """`check`'s answer, with whatever it changed undone (each question starts afresh)."""
    # Django 6.1 renamed savepoint() to savepoint_create() (the old name warns).
    sid = getattr(transaction, "savepoint_create", transaction.savepoint)()
    try:
        return check()
    finally:
        transaction.savepoint_rollback(sid)


def client_for(user) -> Client:
    client = Client()
    if user.is_authenticated:
        client.force_login(user)
    return client


def succeeded(response) -> bool:
    return any(m.level_tag == "success" for m in get_messages(response.wsgi_request))


# --------------------------------------------------------------------------- the API


def api_answers(user, run: Run) -> dict[str, bool]:
    client = client_for(user)
    call = ToolCall.objects.get(run=run)
    detail = reverse("agentrun:run-detail", args=[run.pk])

    def post(name: str, args, body) -> int:
        return client.post(
            reverse(name, args=args), body, content_type="application/json"
        ).status_code

    def resume() -> bool:
        services.cancel_run(run)
        return post("agentrun:run-resume", [run.pk], {}) == 200

    token = services.approval_token(call)
    unknown = UNKNOWNS[run.pk]
    resolve_body = {"token": services.approval_token(unknown), "action": "fail"}
    return {
        "sees": client.get(detail).status_code == 200,
        "events": client.get(reverse("agentrun:run-events", args=[run.pk])).status_code == 200,
        "decides": rolled_back(
            lambda: post("agentrun:toolcall-approve", [call.pk], {"token": token}) == 200
        ),
        # The API has no bulk decision: deciding on each call is the same question.
        "bulk_decides": rolled_back(
            lambda: post("agentrun:toolcall-approve", [call.pk], {"token": token}) == 200
        ),
        "rejects": rolled_back(
            lambda: (
                post("agentrun:toolcall-reject", [call.pk], {"token": token, "reason": "no"}) == 200
            )
        ),
        "resolves": rolled_back(
            lambda: post("agentrun:toolcall-resolve", [unknown.pk], resolve_body) == 200
        ),
        "cancels": rolled_back(lambda: post("agentrun:run-cancel", [run.pk], {}) == 200),
        "resumes": rolled_back(resume),
        "forks": rolled_back(lambda: post("agentrun:run-fork", [run.pk], {"turn": 0}) == 201),
    }


# --------------------------------------------------------------------------- the admin


def admin_answers(user, run: Run) -> dict[str, bool]:
    client = client_for(user)
    call = ToolCall.objects.get(run=run)
    event = run.events.first()
    token = services.approval_token(call)

    def ok(url: str) -> bool:
        return client.get(url).status_code == 200

    def post(url: str, data: dict) -> bool:
        response = client.post(url, data, follow=True)
        assert response.status_code in (200, 404), (url, response.status_code)
        return response.status_code == 200 and succeeded(response)

    def bulk(action: str, target: ToolCall) -> bool:
        """A list action through its confirmation page, posted back with its tokens."""
        url = reverse("admin:agentrun_toolcall_changelist")
        selected = {"_selected_action": [target.pk], "index": "0"}
        page = client.post(url, {"action": action, **selected}, follow=True)
        tokens = dict(re.findall(r'name="(token-\d+)" value="([^"]+)"', page.text))
        return bool(tokens) and post(url, {"action": action, "apply": "1", **selected, **tokens})

    def one_answer(*checks: Callable[[], bool]) -> bool:
        """The answer of every path to one question, which must agree."""
        answers = [rolled_back(check) for check in checks]
        assert len(set(answers)) == 1, (user, run.owner, answers)
        return answers[0]

    unknown = UNKNOWNS[run.pk]
    runs_url = reverse("admin:agentrun_run_changelist")

    def resume() -> bool:
        services.cancel_run(run)
        return post(reverse("admin:agentrun_run_resume", args=[run.pk]), {})

    def listed(url: str, query: dict) -> bool:
        response = client.get(url, query)
        return response.status_code == 200 and any(
            getattr(obj, "run_id", obj.pk) == run.pk for obj in response.context["cl"].result_list
        )

    seen = [
        ok(reverse("admin:agentrun_run_change", args=[run.pk])),
        ok(reverse("admin:agentrun_run_value", args=[run.pk, "input"])),
        ok(reverse("admin:agentrun_toolcall_change", args=[call.pk])),
        ok(reverse("admin:agentrun_toolcall_value", args=[call.pk, "arguments"])),
        listed(reverse("admin:agentrun_run_changelist"), {}),
        listed(reverse("admin:agentrun_toolcall_changelist"), {}),
        ok(reverse("admin:agentrun_run_history", args=[run.pk])),
        ok(reverse("admin:agentrun_toolcall_history", args=[call.pk])),
    ]
    assert len(set(seen)) == 1, (user, run.owner, seen)  # every path gives one answer
    events = [
        ok(reverse("admin:agentrun_runevent_change", args=[event.pk])),
        listed(reverse("admin:agentrun_runevent_changelist"), {"q": str(run.pk)}),
        ok(reverse("admin:agentrun_runevent_value", args=[event.pk, "payload"])),
    ]
    assert len(set(events)) == 1, (user, events)
    return {
        "sees": seen[0],
        "events": events[0],
        "decides": rolled_back(
            lambda: post(
                reverse("admin:agentrun_toolcall_approve", args=[call.pk]), {"approve-token": token}
            )
        ),
        "bulk_decides": rolled_back(lambda: bulk("approve_selected", call)),
        "rejects": rolled_back(
            lambda: post(
                reverse("admin:agentrun_toolcall_reject", args=[call.pk]),
                {"reject-token": token, "reject-reason": "no"},
            )
        ),
        "resolves": one_answer(
            lambda: post(
                reverse("admin:agentrun_toolcall_resolve", args=[unknown.pk]),
                {"resolve-action": "fail", "resolve-token": services.approval_token(unknown)},
            ),
            lambda: bulk("fail_selected", unknown),
        ),
        "cancels": one_answer(
            lambda: post(reverse("admin:agentrun_run_cancel", args=[run.pk]), {}),
            lambda: post(runs_url, {"action": "cancel_selected", "_selected_action": [run.pk]}),
        ),
        "resumes": rolled_back(resume),
        "forks": rolled_back(
            lambda: post(reverse("admin:agentrun_run_fork", args=[run.pk]), {"turn": "0"})
        ),
    }


@pytest.mark.parametrize("name", [*USERS, "root", "anonymous"])
def test_admin_and_api__same_answers_for_the_same_users(world, name):
    users, runs = world
    user = users[name]
    for key, run in runs.items():
        expected = rule(user, run)
        api = api_answers(user, run)
        admin = admin_answers(user, run)
        assert api == expected, ("api", name, key)
        assert admin == {k: v and uses_admin(user) for k, v in expected.items()}, (
            "admin",
            name,
            key,
        )
        if uses_admin(user):
            assert admin == api, (name, key)
    if name == "root":
        assert all(rule(user, run)["decides"] for run in runs.values())


def test_rule__covers_each_kind_of_user(world):
    """The walk above means something: each answer is yes for someone and no for someone."""
    users, runs = world
    seen = {answer: set() for answer in ANSWERS}
    for user in users.values():
        for run in runs.values():
            for answer, value in rule(user, run).items():
                seen[answer].add(value)
    assert all(values == {True, False} for values in seen.values()), seen
