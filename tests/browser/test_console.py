"""The admin as an operator uses it, in headless Chromium at 1,400 px with the nav sidebar
open: decide one call, two through the confirmation page, reject with a reason, settle an
unknown outcome, fork a run from turn 2; what users without the approval permission or
without `agentrun.view_all_runs` see; and no page wider than the window."""

from __future__ import annotations

import re

import pytest

from django_agentrun import start_run
from django_agentrun.models import Run, ToolCall
from django_agentrun.states import RunState, ToolCallState
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests import factories
from tests.conftest import drive

pytestmark = pytest.mark.django_db(transaction=True)

VIEW = ("view_run", "view_toolcall", "view_runevent")
QUEUE = "/admin/agentrun/toolcall/"
RUNS = "/admin/agentrun/run/"

# Whether the page (and every element of its content) fits the window; the nav sidebar open.
OVERFLOW = """() => {
  const problems = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth) problems.push(`page ${doc.scrollWidth} > ${window.innerWidth}`);
  const main = document.querySelector('#main');
  if (!main || !main.classList.contains('shifted')) problems.push('the nav sidebar is not open');
  const content = document.querySelector('#content');
  const right = content.getBoundingClientRect().right + 1;
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  for (const el of content.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (!box.width && !box.height) continue;
    if (box.right > right) problems.push(`${name(el)} ends at ${Math.round(box.right)} > ${Math.round(right)}`);
    const style = getComputedStyle(el);
    if (['auto', 'scroll'].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1)
      problems.push(`${name(el)} scrolls sideways: ${el.scrollWidth} > ${el.clientWidth}`);
  }
  return problems.slice(0, 10);
}"""


def fits(console) -> None:
    problems = console.page.evaluate(OVERFLOW)
    assert problems == [], (console.page.url, problems)


def operator(username: str, *codenames: str):
    return factories.user(username, *VIEW, *codenames, is_staff=True)


def change(obj) -> str:
    return f"/admin/agentrun/{obj._meta.model_name}/{obj.pk}/change/"


def test_console__an_operator_decides_and_forks(console, monkeypatch):
    carol = factories.user("carol")
    operator("olga", "approve_toolcall", "view_all_runs", "cancel_run")
    one, bulk_a, bulk_b, rejected = (factories.parked(carol)[1] for _ in range(4))
    _, unknown, _ = factories.unknown(monkeypatch, carol)
    conversation, _ = factories.conversation(carol)
    page = console.login("olga")

    # One call, on its decision page: the conversation, the tool, the side effect, the key.
    console.go(change(one))
    assert page.locator("#agentrun-conversation").is_visible()
    facts = page.inner_text("#agentrun-callinfo")
    assert "non_idempotent" in facts and one.idempotency_key in facts
    assert "Delete an account" in facts  # the tool's description
    fits(console)
    console.shot("decision-page")
    page.click("#agentrun-approve-form input[type=submit]")
    assert f"Approved delete_account ({one.tool_call_id})." in console.messages()
    one.refresh_from_db()
    assert one.state == ToolCallState.REQUESTED and one.decided_by.username == "olga"

    # Two in bulk, through the confirmation page that shows them whole.
    console.go(QUEUE)
    fits(console)
    console.shot("queue")
    for call in (bulk_a, bulk_b):
        page.check(f"input[name=_selected_action][value='{call.pk}']")
    page.select_option("select[name=action]", "approve_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#agentrun-bulk-calls")
    assert page.locator("#agentrun-bulk-calls tbody tr").count() == 2
    assert ToolCall.objects.filter(pk__in=[bulk_a.pk, bulk_b.pk], approved=True).count() == 0
    fits(console)
    console.shot("bulk-confirmation")
    page.click("#agentrun-bulk-form input[name=apply]")
    assert "Approved 2 tool calls." in console.messages()
    assert ToolCall.objects.filter(pk__in=[bulk_a.pk, bulk_b.pk], approved=True).count() == 2

    # Reject with a reason: the field starts empty, the model reads one sentence.
    console.go(change(rejected))
    assert page.input_value("#id_reject-reason") == ""
    page.fill("#id_reject-reason", "Bob asked us to keep his account")
    page.click("#agentrun-reject-form input[type=submit]")
    rejected.refresh_from_db()
    assert rejected.result == "A person declined this tool call: Bob asked us to keep his account."

    # An unknown outcome, settled by a person who found it at the provider.
    console.go(change(unknown))
    page.check("input[name=resolve-action][value=done]")
    page.fill("#id_resolve-result", '{"charge_id": "ch_42"}')
    page.click("#agentrun-resolve-form input[type=submit]")
    unknown.refresh_from_db()
    assert (unknown.state, unknown.result) == (ToolCallState.SUCCEEDED, {"charge_id": "ch_42"})

    # Fork the conversation from turn 2: a confirmation page, then the new run's page.
    console.go(change(conversation))
    fits(console)
    console.shot("run-page")
    page.click("#agentrun-fork-2")
    page.wait_for_selector("#agentrun-fork-form")
    # The fork is the operator's: it acts with their credentials, not carol's.
    assert "It belongs to olga" in page.inner_text("#content-main")
    page.click("#agentrun-fork-form input[type=submit]")
    page.wait_for_selector("#agentrun-forked-from")
    fork = Run.objects.get(forked_from=conversation)
    assert (fork.forked_at_turn, fork.state, fork.owner.username) == (2, RunState.QUEUED, "olga")
    assert str(fork.pk) in page.url
    assert [t.index for t in fork.turns.order_by("index")] == [0, 1]
    console.go(change(conversation))
    assert page.locator("#agentrun-forks a").inner_text() == str(fork.pk)[:8]

    console.go(RUNS)
    fits(console)
    console.shot("runs-list")
    assert page.locator("#result_list tbody tr").count() == Run.objects.count()


@pytest.mark.parametrize(
    ("codenames", "sees_others", "decides"),
    [
        ((), False, False),
        (("approve_toolcall",), False, True),
        (("view_all_runs",), True, False),
    ],
    ids=["viewer-own", "approver-own", "viewer-all"],
)
def test_console__what_each_operator_sees_and_may_decide(console, codenames, sees_others, decides):
    user = operator("uma", *codenames)
    _, own, _ = factories.parked(user)
    _, theirs, _ = factories.parked(factories.user("carol"))
    page = console.login("uma")

    console.go(QUEUE)
    links = page.locator("#result_list tbody a[href*='/toolcall/']")
    listed = {int(href.split("/")[-3]) for href in links.evaluate_all("e => e.map(a => a.href)")}
    assert listed == ({own.pk, theirs.pk} if sees_others else {own.pk})

    console.go(change(own))
    assert page.locator("#agentrun-approve-form").count() == (1 if decides else 0)
    if not decides:
        assert "not decide on it" in page.inner_text("#agentrun-decision")

    console.go(change(theirs))
    if sees_others:
        assert page.locator("#agentrun-callinfo").is_visible()
    else:
        assert "/admin/agentrun/toolcall/" + str(theirs.pk) not in page.url  # sent away
        assert any("doesn’t exist" in m or "doesn't exist" in m for m in console.messages())


@pytest.mark.no_projection_check  # the input is rewritten in the row, not in its events
def test_console__pages_fit_whatever_a_run_holds(console):
    """At 1,400 px with the sidebar open, nothing is wider than the window: long unbroken
    values, HTML, lone surrogates and a 2 MB input included."""
    operator("olga", "approve_toolcall", "view_all_runs")
    long_word = "x" * 3000
    model = ScriptedClient(
        [
            reply(
                text("<b>not bold</b> " + long_word + " \udcff"),
                tool_use("delete_account", {"user": long_word + "<script>alert(1)</script>"}),
            ),
        ]
    )
    owner = factories.user("a-customer-with-a-rather-long-username")
    run = start_run("test-agent", [{"type": "text", "text": "A" * 2_000_000 + "\x00"}], owner=owner)
    drive(run, model)
    # A lone surrogate in the input, as an earlier release could store it (start_run now
    # refuses input the model could not be sent).
    Run.objects.filter(pk=run.pk).update(
        input=[{"type": "text", "text": "A" * 2_000_000 + "\x00\udcff"}]
    )
    call = run.tool_calls.get()
    page = console.login("olga")
    for path in (change(run), change(call), QUEUE, RUNS, "/admin/agentrun/runevent/"):
        console.go(path)
        fits(console)
    console.go(change(run))
    html = page.content()
    assert len(html) < 500_000  # folded, not dumped
    assert "<b>not bold</b>" in page.inner_text("#agentrun-conversation")  # shown, escaped
    assert re.search(r"Show all", html)
    console.shot("run-page-awkward")


@pytest.mark.parametrize("width", [1280, 1400])
def test_console__run_and_decision_pages_fit_on_every_django(console, width):
    """The run page (an active run: its cancel form; a parked one: its pending banner) and
    the call's decision page fit at 1,280 and 1,400 px on Django 5.2 and 6.x alike: the
    panels sit under the title, never beside it (Django 6.1 puts object-tools there), and
    the title keeps its width (the run id once wrapped one character per line)."""
    operator("olga", "approve_toolcall", "view_all_runs", "cancel_run")
    owner = factories.user("a-customer")
    parked, call, _ = factories.parked(owner)
    active = start_run("test-agent", "nobody works on me", owner=owner)
    page = console.login("olga")
    page.set_viewport_size({"width": width, "height": 900})
    for path, panel in (
        (change(parked), "#agentrun-pending"),
        (change(active), "#agentrun-cancel-form"),
        (change(call), "#agentrun-panels"),
    ):
        console.go(path)
        fits(console)
        title = page.locator("#content h1, #content h2").first.bounding_box()
        assert title["height"] < 80, (path, title)  # one or two lines, not a column
        shown = page.locator(panel).bounding_box()
        assert shown is not None and shown["width"] > 0, (path, panel)
        if panel != "#agentrun-cancel-form":  # a tool, beside the title on Django 6
            # Under the title, as wide as the content (not squeezed into a column beside it).
            assert shown["y"] >= title["y"] + title["height"] - 1, (path, shown, title)
        panels = page.locator("#agentrun-panels").bounding_box()
        assert panels["y"] >= title["y"] + title["height"] - 1, (path, panels, title)
        assert panels["width"] > 0.6 * page.locator("#content").bounding_box()["width"], path
    console.shot(f"run-page-{width}")
