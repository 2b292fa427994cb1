"""The rate-limit governor (clients/governor.py) against a real Redis: limits learned from
the headers, pacing, "not now", the fair share and priorities."""

from __future__ import annotations

import os
import uuid

import pytest

from django_agentrun.clients import governor as gov

# The governor lives in Redis: the same on any Postgres driver and binding.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.one_driver]

HEADERS = {
    "anthropic-ratelimit-requests-limit": "300",  # 5 a second
    "anthropic-ratelimit-requests-remaining": "299",
    "anthropic-ratelimit-requests-reset": "2030-01-01T00:00:00Z",
}


@pytest.fixture
def governor(settings):
    import redis

    url = os.environ.get("AGENTRUN_TEST_BROKER_URL") or "redis://127.0.0.1:6379/9"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("no Redis")
    settings.AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS = 0.5
    settings.AGENTRUN_LEASE_SECONDS = 3
    g = gov.Governor(url, prefix=f"agentrun:test-gov:{uuid.uuid4().hex}")
    yield g
    for key in g._redis.scan_iter(f"{g.prefix}:*"):
        g._redis.delete(key)


def ask(g, key="a", ticket=None, priority=1):
    admission = {"key": key, "ticket": ticket or uuid.uuid4().hex, "priority": priority}
    return g.admit("scope", "m", admission, 10)


def test_read_headers__rates_and_a_spent_dimension():
    fields, blocked = gov.read_headers(HEADERS)
    assert fields == {"req_rate": 5.0, "req_burst": 5.0}
    assert blocked == 0
    spent = {**HEADERS, "anthropic-ratelimit-requests-remaining": "0"}
    _, blocked = gov.read_headers(spent, now=1893456000 - 2.5)  # 2030-01-01 minus 2.5 s
    assert blocked == pytest.approx(2.5)


def test_scope__hashes_the_key():
    scope = gov.scope_of("sk-ant-secret", "https://api.anthropic.com")
    assert "secret" not in scope and len(scope) == 24
    assert scope != gov.scope_of("sk-ant-other", "https://api.anthropic.com")


def test_admit__nothing_learned_goes(governor):
    assert all(ask(governor).go for _ in range(50))


def test_admit__paces_then_says_not_now(governor):
    governor.learn("scope", "m", HEADERS)
    verdicts = [ask(governor) for _ in range(12)]
    went = [v for v in verdicts if v.go]
    # A second's burst at once, then what the pacing bound allows, then "not now".
    assert [v.wait for v in went[:5]] == [0.0] * 5
    assert 7 <= len(went) <= 8
    assert all(0 < v.wait <= 0.5 for v in went[5:])
    refused = [v for v in verdicts if not v.go]
    assert refused and all(v.wait >= 0.2 for v in refused)


def test_learn__retry_after_blocks_everyone(governor):
    governor.learn("scope", "m", HEADERS, retry_after=5)
    verdict = ask(governor)
    assert not verdict.go and 4 < verdict.wait <= 5.5


def test_fair_share__a_waiting_key_with_fewer_grants_goes_first(timed):
    g, clock = timed
    while ask(g, "a").go:  # key a: its burst and the pacing's
        pass
    b = ask(g, "b", ticket="b1")
    assert not b.go  # the limit is spent for now: b waits too, but with fewer grants
    clock.now += b.wait - 0.1  # b is about to come back, and the limit has room again
    assert not ask(g, "a").go  # that room is b's: a waits behind it
    clock.now += 0.1
    assert ask(g, "b", ticket="b1").go  # b comes back: its turn
    clock.now += 0.2
    assert ask(g, "a").go  # b no longer waits


def test_fair_share__room_nobody_waits_for_now_is_not_held(timed):
    """A place in line holds room only as its run comes back: before, the limit's room goes
    to whoever asks (it sat idle for the whole wait)."""
    g, clock = timed
    while ask(g, "a").go:
        pass
    told = {f"b{n}": ask(g, "b", ticket=f"b{n}") for n in range(4)}
    latest = max(v.wait for v in told.values())
    assert not any(v.go for v in told.values()) and latest >= 1.0
    clock.now += 0.7  # room for three requests again: two for b0 and b1, back by now
    assert ask(g, "a").go  # the limit's room is not held for runs that are not back
    clock.now += latest - 0.7
    assert ask(g, "b", ticket=max(told, key=lambda t: told[t].wait)).go  # b still goes


def test_priority__interactive_waits_ahead_of_background(timed):
    g, clock = timed
    while ask(g, "a", priority=1).go:
        pass
    c = ask(g, "c", ticket="c1", priority=0)
    assert not c.go
    clock.now += c.wait - 0.1
    assert not ask(g, "z", priority=1).go  # the room is the priority-0 request's
    clock.now += 0.1
    assert ask(g, "c", ticket="c1", priority=0).go


def test_unreachable_redis__fails_open(settings):
    g = gov.Governor("redis://127.0.0.1:1/0")
    assert ask(g).go


@pytest.mark.django_db
def test_fair_share_key__the_agent_names_it_before_the_host_and_the_owner(settings, caplog):
    """An Agent's fair_share_key(run) is the key its runs' requests share the limit under;
    without one, AGENTRUN_FAIR_SHARE_KEY's function, then the owner. A key function that
    fails is logged and the next key is used: the run goes on."""
    from django_agentrun import start_run
    from django_agentrun.agents import Agent, unregister_agent
    from django_agentrun.exceptions import ConfigurationError
    from django_agentrun.testing import ScriptedClient, reply, text
    from tests import factories
    from tests.conftest import drive

    ann = factories.user("ann")
    tenants = {"tenant": "acme"}
    Agent("by-tenant", model="claude-sonnet-4-5", fair_share_key=lambda run: run.metadata["tenant"])
    Agent("by-nothing", model="claude-sonnet-4-5", fair_share_key=lambda run: run.metadata["x"])
    with pytest.raises(ConfigurationError, match="fair_share_key must be a callable"):
        Agent("bad", fair_share_key="acme", register=False)
    try:
        shared = {}
        for agent in ("by-tenant", "by-nothing", "test-agent"):
            client = ScriptedClient([reply(text("ok"))])
            run = start_run(agent, "hi", owner=ann, metadata=tenants)
            drive(run, client)
            run.refresh_from_db()
            assert run.state == "completed", (agent, run.error_message)
            shared[agent] = gov.share_of(client.requests[0].admission)[0]
        assert shared == {
            "by-tenant": "acme",
            "by-nothing": f"owner:{ann.pk}",
            "test-agent": f"owner:{ann.pk}",
        }
        assert "fair_share_key of agent by-nothing failed" in caplog.text
        settings.AGENTRUN_FAIR_SHARE_KEY = "tests.testapp.agents.tenant_of"
        run = start_run("test-agent", "hi", owner=ann, metadata=tenants)
        client = ScriptedClient([reply(text("ok"))])
        drive(run, client)
        assert gov.share_of(client.requests[0].admission)[0] == "host:acme"
        run = start_run("by-tenant", "hi", owner=ann, metadata={"tenant": "umbrella"})
        client = ScriptedClient([reply(text("ok"))])
        drive(run, client)
        assert gov.share_of(client.requests[0].admission)[0] == "umbrella"  # the agent's first
    finally:
        unregister_agent("by-tenant")
        unregister_agent("by-nothing")


class Clock:
    """The governor's clock played forward by the test (Governor(clock=...))."""

    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timed(governor, settings):
    """The governor on a clock the test plays, without pacing: a request goes only if the
    limit has room for it now."""
    settings.AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS = 0
    clock = Clock()
    governor.clock = clock
    governor.learn("scope", "m", HEADERS)  # 5 requests a second, a burst of 5
    return governor, clock


def test_fair_share__a_place_in_line_nobody_comes_back_for_holds_nobody_back(timed):
    """A run told "not now" that never comes back (cancelled meanwhile) kept its place for
    a lease and 10 seconds; every other key waited behind it with the limit idle."""
    g, clock = timed
    while ask(g, "a").go:  # a's burst, then the pacing's
        pass
    told = ask(g, "b", ticket="b1")
    assert not told.go  # b waits (and never comes back)
    clock.now += told.wait + gov.RETURN_SLACK + 0.01
    assert ask(g, "a").go  # the limit has room again: a is not held behind b's empty place


def test_fair_share__a_background_request_ages_ahead_of_steady_interactive_load(timed, settings):
    """Interactive requests at the limit's pace kept a background one waiting forever."""
    settings.AGENTRUN_FAIR_SHARE_AGING_SECONDS = 10
    g, clock = timed
    waited, back = None, 2.0  # z asks first at the third second, then when told
    for tick in range(250):  # 25 s at 10 interactive requests a second (twice the limit)
        clock.now += 0.1
        ask(g, "c", ticket=f"c{tick}", priority=0)
        if waited is None and tick / 10 >= back:
            told = ask(g, "z", ticket="z1", priority=1)
            if told.go:
                waited = tick / 10 - 2.0
            back = tick / 10 + told.wait
    assert waited is not None and 10 <= waited <= 12, waited
