"""The schedule explorer: the real engine, services and reaper on the real store (Postgres),
run by several actors (worker tasks, reaper passes, people, heartbeats, the clock) that
interleave at every scheduling point in an order chosen from a seed, with the promise
checked after every move and once everything is at rest. FoundationDB's simulation,
TigerBeetle's VOPR and Coyote's PCT are the models: random walks with a few priority
changes, plus a bounded exhaustive search of small scenarios; a failing schedule prints its
seed and steps, and replays exactly (`explore(..., replay=[...])`).

- controller.py: actors as threads, one moving at a time; lock waits noticed; crashes;
- world.py: the broker, worker slots, the heartbeat as moves, the tools and their truth;
- schedule.py: the moves, a schedule's fault phase and its rest phase;
- invariants.py: the promise as checks;
- choosers.py: random walks with priority changes, replay, exhaustive search;
- harness.py: the patches that put the engine under the scheduler, and `explore`.

docs/how-to/development.md says how to run it (`make explore SCHEDULES=N`).
"""
