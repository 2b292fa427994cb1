"""6. Storage per run against the transcript's own size.

Runs of 5, 10 and 20 turns, driven in-process: every turn but the last has a text
block and one tool call (`small`: 200 B of text, a 300 B result; `large`: 1 KB and
4 KB), the last a text answer; text is incompressible (base64 of hashes). Per run:
the bytes of its rows in the four agentrun tables (sum of pg_column_size of each
row, as stored: TOASTed values count compressed), the growth of the tables on disk
(pg_total_relation_size with indexes and TOAST, per run; page-grained, so coarse),
and the transcript: the JSON of the messages the model would be sent next
(build_messages over the recorded turns). A checkpoint-per-step design would store
every prefix of the transcript: shown for contrast.
"""

from __future__ import annotations

import json

from .common import check, figure, section, table
from .engine import _stub_dispatch

NAME = "storage"
TABLES = ("agentrun_run", "agentrun_turn", "agentrun_toolcall", "agentrun_runeventrow")
SIZES = {"small": (200, 300), "large": (1000, 4000)}


def _disk() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) AS c", [list(TABLES)]
        )
        return int(cursor.fetchone()[0])


HOT_TABLES = ("agentrun_run", "agentrun_turn", "agentrun_toolcall")


def _updates() -> dict[str, tuple[int, int]]:
    """(updates, HOT updates) per table so far, by pg_stat_user_tables: this backend's
    counts flushed first (pg_stat_force_next_flush, Postgres 15+; they are reported when
    the backend goes idle)."""
    import time

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = ANY(%s)",
            [list(HOT_TABLES)],
        )
        return {name: (int(upd), int(hot)) for name, upd, hot in cursor.fetchall()}


def _row_bytes(run_id) -> dict[str, int]:
    from django.db import connection

    out = {}
    with connection.cursor() as cursor:
        for name in TABLES:
            key = "id" if name == "agentrun_run" else "run_id"
            cursor.execute(
                f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {name} t WHERE t.{key} = %s",
                [run_id],
            )
            out[name] = int(cursor.fetchone()[0])
    return out


def _transcript(run_id) -> tuple[int, int]:
    """(bytes of the final transcript, bytes of all its per-step prefixes)."""
    from django_agentrun.engine.history import TurnRecord, build_messages
    from django_agentrun.models import Run

    run = Run.objects.get(pk=run_id)
    records = []
    prefixes = 0
    for turn in run.turns.order_by("index"):
        calls = sorted(turn.tool_calls.all(), key=lambda c: c.position)
        results = [c.tool_result_block() for c in calls if c.is_closed]
        records.append(TurnRecord(turn.index, turn.content, results))
        prefixes += len(json.dumps(build_messages(run.input, records)).encode())
    return len(json.dumps(build_messages(run.input, records)).encode()), prefixes


def _series(kind: str, turns: int, runs: int, client) -> dict:
    from django_agentrun import start_run
    from django_agentrun.engine import Outcome, advance
    from django_agentrun.models import Run

    text, result = SIZES[kind]
    before = _disk()
    ids = []
    for i in range(runs):
        run_obj = start_run(
            "bench-storage",
            f"storage turns={turns} text={text} result={result} id={kind}-{turns}-{i}",
        )
        while advance(run_obj.pk, client=client) == Outcome.CONTINUED:
            pass
        ids.append(run_obj.pk)
    disk = (_disk() - before) / runs
    states = set(Run.objects.filter(pk__in=ids).values_list("state", "turn_count"))
    if states != {("completed", turns)}:
        raise RuntimeError(f"storage: runs did not complete as scripted: {states}")
    rows = [_row_bytes(pk) for pk in ids]
    transcript, prefixes = _transcript(ids[0])
    per_table = {t: sum(r[t] for r in rows) / runs for t in TABLES}
    return {
        "kind": kind,
        "turns": turns,
        "disk": disk,
        "rows": sum(per_table.values()),
        "tables": per_table,
        "transcript": transcript,
        "prefixes": prefixes,
    }


def run(quick: bool) -> None:
    from .clients import BenchClient

    section("6. Storage per run vs the transcript's own size")
    runs = 3 if quick else 8
    client = BenchClient()
    task, _ = _stub_dispatch()
    results: dict[str, list[dict]] = {}
    updates_before = _updates()
    try:
        for kind in SIZES:
            results[kind] = [_series(kind, turns, runs, client) for turns in (5, 10, 20)]
    finally:
        del task.apply_async
    updates_after = _updates()
    out = []
    for kind, series in results.items():
        for r in series:
            out.append(
                [
                    f"{kind} {r['turns']} turns",
                    r["transcript"],
                    r["rows"],
                    r["rows"] / r["transcript"],
                    *(r["tables"][t] for t in TABLES),
                    r["disk"],
                    r["prefixes"] / r["transcript"],
                ]
            )
    print(
        table(
            [
                "run",
                "transcript B",
                "rows B",
                "rows/transcript",
                "run row",
                "turns",
                "toolcalls",
                "events",
                "on disk B",
                "copy-per-step x",
            ],
            out,
        )
    )
    hot = []
    for name in HOT_TABLES:
        upd = updates_after.get(name, (0, 0))[0] - updates_before.get(name, (0, 0))[0]
        hot_upd = updates_after.get(name, (0, 0))[1] - updates_before.get(name, (0, 0))[1]
        hot.append(f"{name} {hot_upd}/{upd} ({100 * hot_upd / upd if upd else 0:.0f}%)")
        if name == "agentrun_run":
            figure(NAME, "HOT share of the run row's updates", f"{hot_upd / upd if upd else 0:.2f}")
    print("  HOT updates (pg_stat_user_tables n_tup_hot_upd / n_tup_upd): " + ", ".join(hot))
    linear = True
    for kind, (a, b, c) in results.items():
        slope1 = (b["rows"] - a["rows"]) / (b["turns"] - a["turns"])
        slope2 = (c["rows"] - b["rows"]) / (c["turns"] - b["turns"])
        tslope = (c["transcript"] - b["transcript"]) / (c["turns"] - b["turns"])
        ratios = [r["rows"] / r["transcript"] for r in (a, b, c)]
        print(
            f"  {kind}: bytes added per turn {slope1:.0f} (5->10), {slope2:.0f} (10->20); the transcript "
            f"grows {tslope:.0f} B per turn: {slope2 / tslope:.2f} B stored per transcript byte"
        )
        linear = linear and slope2 <= 1.25 * slope1 and ratios[2] <= ratios[0] * 1.1
        figure(
            NAME, f"{kind}: stored bytes per transcript byte (per turn)", f"{slope2 / tslope:.2f}"
        )
    big = results["large"]
    big_ratio = (big[2]["rows"] - big[1]["rows"]) / (big[2]["transcript"] - big[1]["transcript"])
    check(
        NAME,
        "about its own bytes (<= 1.5 B stored per transcript byte, large messages)",
        big_ratio <= 1.5,
        f"{big_ratio:.2f} B per byte (small messages: "
        f"{(results['small'][2]['rows'] - results['small'][1]['rows']) / (results['small'][2]['transcript'] - results['small'][1]['transcript']):.2f})",
    )
    a, c = results["small"][0], results["small"][2]
    check(
        NAME,
        "storage linear in the transcript (no copy per step)",
        linear,
        f"rows/transcript {a['rows'] / a['transcript']:.2f} (5 turns) -> "
        f"{c['rows'] / c['transcript']:.2f} (20 turns); a copy per step: {c['prefixes'] / c['transcript']:.1f}x",
    )
