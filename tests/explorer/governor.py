"""The governor's schedules: owners ask for the account's limit as their runs would, on the
real Lua script in Redis, with the governor's clock played forward by the schedule
(`Governor(clock=...)`): runs arrive, are told "not now", come back when told or never
(cancelled meanwhile), interactive and background at once. The invariants:

- never past the limit: at no time have more requests gone in the last second than the
  rate allows, with its burst;
- no request waits while the limit has room: a place in line nobody comes back for (its
  run was cancelled) holds nobody back longer than RETURN_SLACK past the time its run
  was to come back by, and over a schedule with more demand than the limit the limit is
  used (at least 85% of its rate while requests ask);
- background requests age: while background runs keep coming back when told, one is
  granted within the aging time after the first was told "not now", and the longest wait
  any was told (a run comes back only when told), and a place's slack.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from django_agentrun.clients import governor as gov

RATE = 5.0  # requests a second: the headers below
HEADERS = {
    "anthropic-ratelimit-requests-limit": str(int(RATE * 60)),
    "anthropic-ratelimit-requests-remaining": "1",
    "anthropic-ratelimit-requests-reset": "2030-01-01T00:00:00Z",
}


@dataclass
class Clock:
    now: float = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Run:
    key: str
    priority: int
    ticket: str
    first_refused: float | None = None
    granted: float | None = None


@dataclass
class Outcome:
    grants: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    steps: int = 0


def schedule(g: gov.Governor, clock: Clock, seed: int, *, aging: float, seconds: float = 60.0):
    """One schedule of `seconds` of the governor's time (see the module's docstring)."""
    rng = random.Random(seed)
    g.learn("scope", "m", HEADERS)
    due: list[tuple[float, int, Run]] = []  # (when it asks, order, run)
    order = 0
    keys = [("a", 0), ("b", 0), ("z", 1)]  # two interactive owners, one background
    for n in range(int(seconds * RATE * 1.6)):  # more demand than the limit
        key, priority = keys[rng.randrange(len(keys))]
        when = clock.now + rng.uniform(0, seconds * 0.8)
        heapq.heappush(due, (when, order := order + 1, Run(key, priority, f"{key}{seed}-{n}")))
    out, start, gone = Outcome(), clock.now, set()
    background_since: float | None = None  # a background run refused, none granted since
    longest = 0.0  # the longest wait a background run was told
    checked = float("-inf")  # when the places of runs gone were last looked at
    while due and clock.now < start + seconds:
        when, _, run = heapq.heappop(due)
        clock.now = max(clock.now, when)
        out.steps += 1
        verdict = g.admit(
            "scope", "m", {"key": run.key, "priority": run.priority, "ticket": run.ticket}, 10
        )
        if verdict.go:
            out.grants.append(clock.now + verdict.wait)
            run.granted = clock.now
            background_since = None if run.priority else background_since
            continue
        if run.first_refused is None:
            run.first_refused = clock.now
        if clock.now >= checked + 0.5:  # a place kept too long stays in the set: seen later
            _held_by_nobody(g, clock.now, gone, out)  # (each look reads the whole line)
            checked = clock.now
        if run.priority:
            longest = max(longest, verdict.wait)
            background_since = background_since if background_since is not None else clock.now
            if clock.now - background_since > aging + longest * 1.3 + gov.RETURN_SLACK:
                out.violations.append(
                    f"background requests got nothing for {clock.now - background_since:.1f}s"
                )
                background_since = clock.now
        if run.priority == 0 and rng.random() < 0.25:
            gone.add(run.ticket)
            continue  # cancelled meanwhile: never comes back
        back = clock.now + verdict.wait * rng.uniform(1.0, 1.3)  # woken a little late
        heapq.heappush(due, (back, order := order + 1, run))
    _held_by_nobody(g, clock.now, gone, out)
    used = len(out.grants) / (RATE * (clock.now - start))
    if used < 0.85:
        out.violations.append(f"the limit was used at {used:.0%} of its rate")
    sent = sorted(out.grants)
    for i, at in enumerate(sent):
        window = [t for t in sent[: i + 1] if t > at - 1.0]
        if len(window) > RATE + RATE + 1:  # a second's rate on top of its burst
            out.violations.append(
                f"{len(window)} requests went in the second before {at - start:.2f}s"
            )
            break
    return out


def _held_by_nobody(g: gov.Governor, now: float, gone: set[str], out: Outcome) -> None:
    """A place in line whose run never comes back, kept longer than RETURN_SLACK (at least
    two intervals) past the time it was to come back by."""
    waiting = g._keys("scope", "m")[2]
    keep = max(gov.RETURN_SLACK, 2 / RATE)
    for member, due in g._redis.zrange(waiting, 0, -1, withscores=True):
        ticket = member.decode().split("|", 2)[2]
        if ticket in gone and due + keep < now - 1e-6:
            out.violations.append(f"{ticket}'s place kept {now - due:.1f}s after it was due")
