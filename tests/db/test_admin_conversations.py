"""The admin's conversation pages: read-only, a user sees the conversations the API shows
them (their own, or all with `agentrun.view_all_runs`), each page listing its runs in
order with links to their pages."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_agentrun import send_message, start_conversation
from tests import factories

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:agentrun_conversation_changelist")


def page(pk) -> str:
    return reverse("admin:agentrun_conversation_change", args=[pk])


def staff(name: str, *codenames: str) -> Client:
    client = Client()
    client.force_login(
        factories.user(name, "view_conversation", "view_run", *codenames, is_staff=True)
    )
    return client


def test_admin__a_conversation_page_lists_its_runs_for_those_who_may_see_it():
    owner = factories.user("alice", "view_conversation", "view_run", is_staff=True)
    conversation = start_conversation("chat", owner=owner)
    first = send_message(conversation, "First <b>message</b>.")
    second = send_message(conversation, "Second.", policy="rollback")
    client = Client()
    client.force_login(owner)

    listing = client.get(CHANGELIST)
    assert listing.status_code == 200 and str(conversation.pk)[:8] in listing.text
    shown = client.get(page(conversation.pk))
    assert shown.status_code == 200
    html = shown.text
    for run in (first, second):
        assert reverse("admin:agentrun_run_change", args=[run.pk]) in html
    assert "First &lt;b&gt;message&lt;/b&gt;." in html and "rolled back" in html
    assert ">busy<" in html
    assert 'name="_save"' not in html  # read-only

    other = staff("bob")
    assert str(conversation.pk)[:8] not in other.get(CHANGELIST).text
    hidden = other.get(page(conversation.pk), follow=True)  # Django: "doesn't exist"
    assert hidden.redirect_chain[-1][0] == reverse("admin:index")
    assert "doesn’t exist" in hidden.text
    viewer = staff("vera", "view_all_runs")
    assert viewer.get(page(conversation.pk)).status_code == 200
    assert viewer.post(page(conversation.pk), {}).status_code == 403
