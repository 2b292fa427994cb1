"""Who moves next. A chooser picks an index into the moves a step offers (schedule.World
lists them in a fixed order: the actor that moved last first, then the others, a delivery,
the reaper, people, faults); the picks are the schedule.

- `Walk`: a random walk from a seed in the manner of PCT (Coyote's probabilistic
  concurrency testing): every actor gets a random priority and the highest-priority
  parked actor moves, but at `depth` random steps the actor that moved is demoted; people,
  the reaper and faults come in with small probabilities.
- `Guided`: a random walk steered by coverage, as a fuzzer is: each move but the default
  has a key (what it does, and where every parked actor is: schedule.World.moves); a key
  never taken in this exploration weighs far more than one taken often, so that each
  fault, decision and preemption is soon tried at every point it can meet, and then in
  every combination the earlier ones lead to. Its coverage is shared by the schedules of
  one exploration (pass one `Counter`); its picks replay a schedule on their own.
- `Replay`: the picks of a schedule printed before.
- `Plan`: a bounded exhaustive search (preemption bounding, as in CHESS): every schedule
  that departs from the default pick (index 0) at most `bound` times, enumerated by
  `exhaustive`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any


class Walk:
    def __init__(
        self,
        seed: int,
        *,
        depth: int = 3,
        horizon: int = 40,
        p_fault: float = 0.12,
        p_person: float = 0.12,
        p_reap: float = 0.08,
        p_end: float = 0.35,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.changes = set(self.rng.sample(range(horizon), depth))
        self.priority: dict[str, float] = {}
        self.p_fault, self.p_person, self.p_reap, self.p_end = p_fault, p_person, p_reap, p_end
        self.picks: list[int] = []
        self.demoted = 0.0

    def _rank(self, label: str) -> float:
        actor = label.split(" ")[1]
        if actor not in self.priority:
            self.priority[actor] = self.rng.random() + 1.0
        return self.priority[actor]

    def choose(self, step: int, moves: list[Any]) -> int:
        pick = self._choose(step, moves)
        self.picks.append(pick)
        return pick

    def _choose(self, step: int, moves: list[Any]) -> int:
        by_kind: dict[str, list[int]] = {}
        for i, move in enumerate(moves):
            by_kind.setdefault(move.kind, []).append(i)
        roll = self.rng.random()
        for kind, p in (("fault", self.p_fault), ("person", self.p_person), ("reap", self.p_reap)):
            if roll < p and kind in by_kind:
                return self.rng.choice(by_kind[kind])
            roll -= p
        if "end" in by_kind and self.rng.random() < self.p_end:
            return by_kind["end"][0]
        goes = by_kind.get("go", [])
        if "deliver" in by_kind and (not goes or self.rng.random() < 0.3):
            return by_kind["deliver"][0]
        if goes:
            best = max(goes, key=lambda i: self._rank(moves[i].label))
            if step in self.changes:  # PCT: the actor that moves now is demoted after
                self.demoted -= 1.0
                self.priority[moves[best].label.split(" ")[1]] = self.demoted
            return best
        others = [i for i, m in enumerate(moves) if m.kind != "end"]
        return self.rng.choice(others) if others else 0


# How often a step departs from the default move, and how much more a key never taken
# in this exploration weighs than one taken once (then 1/n).
DEPART = 0.25
NEW = 20.0


class Guided:
    def __init__(self, seed: int, coverage: Counter | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.coverage = coverage if coverage is not None else Counter()
        self.picks: list[int] = []

    def weight(self, move: Any) -> float:
        seen = self.coverage[move.key]
        return NEW if not seen else 1.0 / seen

    def choose(self, step: int, moves: list[Any]) -> int:
        others = [i for i, m in enumerate(moves) if m.key is not None and i > 0]
        pick = 0
        if others and (moves[0].key is not None or self.rng.random() < DEPART):
            candidates = others if moves[0].key is None else [0, *others]
            weights = [self.weight(moves[i]) for i in candidates]
            pick = self.rng.choices(candidates, weights)[0]
        if moves[pick].key is not None:
            self.coverage[moves[pick].key] += 1
        self.picks.append(pick)
        return pick


class Script:
    """A schedule written out: at each step the first move whose label starts with the next
    entry (entries are taken in turn; a step none matches takes the default, index 0). The
    explorer's defects are kept as such schedules (tests/postgres/test_explore.py)."""

    def __init__(self, *steps: str) -> None:
        self.steps = list(steps)
        self.picks: list[int] = []

    def choose(self, step: int, moves: list[Any]) -> int:
        pick = 0
        if self.steps:
            found = [i for i, m in enumerate(moves) if m.label.startswith(self.steps[0])]
            if found:
                pick = found[0]
                self.steps.pop(0)
        self.picks.append(pick)
        return pick


class Replay:
    def __init__(self, picks: list[int]) -> None:
        self.picks = list(picks)

    def choose(self, step: int, moves: list[Any]) -> int:
        pick = self.picks[step] if step < len(self.picks) else 0
        return min(pick, len(moves) - 1)


class Plan:
    """Pick index 0 everywhere but at the steps of `departures` ({step: index}); record how
    many moves each step offered, to enumerate the schedules that depart once more."""

    def __init__(self, departures: dict[int, int]) -> None:
        self.departures = dict(departures)
        self.offered: list[int] = []
        self.picks: list[int] = []

    def choose(self, step: int, moves: list[Any]) -> int:
        self.offered.append(len(moves))
        pick = min(self.departures.get(step, 0), len(moves) - 1)
        self.picks.append(pick)
        return pick


def exhaustive(run: Any, bound: int, limit: int) -> Iterator[tuple[Plan, Any]]:
    """Every schedule that departs from the default at most `bound` times (depth first, at
    most `limit` schedules): `run(plan)` runs one and returns its result."""
    stack: list[dict[int, int]] = [{}]
    done = 0
    while stack and done < limit:
        departures = stack.pop()
        plan = Plan(departures)
        result = run(plan)
        done += 1
        yield plan, result
        if len(departures) >= bound:
            continue
        after = max(departures, default=-1)
        children = [
            {**departures, step: index}
            for step in range(after + 1, len(plan.offered))
            for index in range(1, plan.offered[step])
        ]
        stack.extend(reversed(children))
