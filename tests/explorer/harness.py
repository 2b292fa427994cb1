"""What puts the real code under the scheduler for the length of a schedule, and the
scenarios the explorer runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django_agentrun import failpoints, reaper, signals, wakeups
from django_agentrun.agents import unregister_agent
from django_agentrun.engine import claim, driver, model_turn
from django_agentrun.store import backend

from . import world as w
from .controller import THREADS
from .schedule import Result, Scenario, World

# Store calls that are no commit boundary (reads of the clock): not points.
QUIET = frozenset({"now", "vendor"})


class ScheduledStore:
    """The chosen store, with a scheduling point before each of its operations."""

    def __init__(self, inner: Any, world: World) -> None:
        self._inner = inner
        self._world = world

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if name in QUIET or not callable(found):
            return found
        point = self._world.controller.point

        def scheduled(*args: Any, **kwargs: Any) -> Any:
            point(f"store.{name}")
            return found(*args, **kwargs)

        return scheduled


@contextlib.contextmanager
def installed(world: World, monkeypatch: Any) -> Iterator[None]:
    """The engine, the services and the reaper under `world`'s scheduler."""
    inner = backend.chosen()
    real_ask = model_turn.ask

    def ask(step: Any, turn: Any) -> Any:
        # Checked when the request goes out (model.ExplorerClient, past its point: a late
        # worker's heartbeat may end it there), not here, before the engine's own look.
        actor = w.CURRENT.get()
        if actor is not None:
            actor.asking = (step.run_id, turn.index)
        return real_ask(step, turn)

    def raising(**kwargs: Any) -> None:
        raise RuntimeError("SMTP server unavailable (a receiver's error)")

    backend.replace(ScheduledStore(inner, world))
    monkeypatch.setattr(wakeups, "_task", world.broker)
    monkeypatch.setattr(wakeups, "waiting_runs", world.broker.held)
    monkeypatch.setattr(reaper, "LOOK_AGAIN_SECONDS", 0)
    monkeypatch.setattr(claim, "holder_is_dead", lambda owner: owner in world.dead_owners)
    monkeypatch.setattr(claim.children, "kill_marked", lambda holder, **kw: True)
    monkeypatch.setattr(driver, "Heartbeat", w.FakeBeat)
    monkeypatch.setattr(model_turn, "ask", ask)
    if world.scenario.webhooks:
        _webhooks(world, monkeypatch)
    failpoints.set_scheduler(world.controller.point)
    if world.scenario.raising_receiver:
        signals.approval_requested.connect(raising, dispatch_uid="explorer-raising")
    try:
        yield
    finally:
        failpoints.set_scheduler(None)
        signals.approval_requested.disconnect(dispatch_uid="explorer-raising")
        world.controller.release_crashed()
        backend.replace(inner)


def _webhooks(world: World, monkeypatch: Any) -> None:
    """A subscription to every event; its deliveries handed to the world's sender queue, and
    each try's request a pair of scheduling points (no HTTP: the tries' bookkeeping is what
    interleaves), recorded so that two sends of one delivery at once are seen."""
    from django.conf import settings

    from django_agentrun.conf import agentrun_settings
    from django_agentrun.store import outbox
    from django_agentrun.webhooks import delivery

    secret = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"  # 24 bytes
    hook = {"name": "explorer", "url": "https://hooks.example.test/in", "secret": secret}
    # Django's settings and the app's reading of them (agentrun_settings keeps what it read
    # until a setting_changed, which a plain setattr does not send: after another scenario
    # in the same test had read AGENTRUN_WEBHOOKS, this one's subscription went unseen).
    for name, value in (
        ("WEBHOOKS", [{**hook, "events": ["*"]}]),
        ("WEBHOOK_SUBSCRIPTIONS_CACHE_SECONDS", None),
        ("WEBHOOK_LOST_AFTER_SECONDS", 0),
    ):
        monkeypatch.setattr(settings, f"AGENTRUN_{name}", value, raising=False)
        monkeypatch.setattr(agentrun_settings, name, value, raising=False)
    monkeypatch.setattr(outbox, "_sender", lambda pk, countdown=None: world.hooks.append(pk))

    def post(row: Any) -> Any:
        actor = world.controller.current()
        world.controller.point("webhook.post")
        sending = world.truth.sending.setdefault(row.webhook_id, set())
        sending.add(actor)
        if len({a for a in sending if a.alive}) > 1:
            world.truth.violated(f"webhook {row.webhook_id} sent twice at once")
        world.truth.sent[row.webhook_id] += 1
        world.controller.point("webhook.posted")
        sending.discard(actor)
        return delivery.Tried(True, status_code=204)

    monkeypatch.setattr(delivery, "post", post)


@contextlib.contextmanager
def explorer_agent() -> Iterator[None]:
    w.define_agent()
    try:
        yield
    finally:
        unregister_agent(w.AGENT)
        THREADS.close_connections()


def explore(scenario: Scenario, chooser: Any, monkeypatch: Any, *, max_moves: int = 60) -> Result:
    """Run one schedule of `scenario` as `chooser` picks."""
    world = World(scenario, chooser, max_moves=max_moves)
    with monkeypatch.context() as patch, installed(world, patch):
        result = world.run()
    result.picks = list(getattr(chooser, "picks", []))
    return result


def report(result: Result, seed: Any) -> str:
    """What a failing schedule prints: its seed, its picks (to replay it) and its steps."""
    lines = [
        f"scenario {result.scenario}, seed {seed}: {len(result.violations)} violation(s)",
        *[f"  VIOLATION: {v}" for v in result.violations],
        f"  replay: Replay({getattr(result, 'picks', [])})",
        "  steps:",
        *[f"    {i:3d}. {s}" for i, s in enumerate(result.steps)],
    ]
    return "\n".join(lines)


SCENARIOS = {
    # A payment with an honest check, people cancelling: a result dropped under the
    # reaper's reservation; a cancel that meets a park.
    "pay": Scenario("pay", ((("x_pay", {"amount": 5}),),), people=("cancel",)),
    # A charge without a check: an unknown outcome goes to a person.
    "charge": Scenario("charge", ((("x_charge", {"amount": 7}),),), people=("cancel", "resume")),
    # A lookup then a payment, forked after the lookup while the original goes on.
    "fork": Scenario(
        "fork",
        ((("x_look", {"q": "f"}),), (("x_pay", {"amount": 4}),)),
        people=("fork", "cancel"),
    ),
    # An approval raced by people and workers; its receiver fails (an SMTP error).
    "approve": Scenario(
        "approve",
        ((("x_refund", {"order": "A1"}),),),
        people=("approve", "reject", "cancel"),
        raising_receiver=True,
    ),
    # A cancel as the run parks for an approval, receivers fine.
    "park": Scenario("park", ((("x_refund", {"order": "B2"}),),), people=("cancel", "approve")),
    # A batch of read-only calls and an idempotent write, then a payment.
    "batch": Scenario(
        "batch",
        (
            (("x_look", {"q": "a"}), ("x_look", {"q": "b"}), ("x_note", {"text": "n"})),
            (("x_pay", {"amount": 3}),),
        ),
        people=("cancel",),
    ),
    # Webhooks of an approval and the run's end, sent by a sender actor while the run goes on.
    "hooks": Scenario(
        "hooks",
        ((("x_refund", {"order": "C3"}),),),
        people=("approve", "cancel"),
        webhooks=True,
    ),
    # A conversation: messages under each busy policy while its run works.
    "chat": Scenario(
        "chat",
        ((("x_look", {"q": "c"}),), (("x_pay", {"amount": 2}),)),
        people=("message:enqueue", "message:interrupt", "message:rollback", "stop"),
        conversation=True,
    ),
}
