"""Run.phase (issue #38): a run's update at a turn's commit is HOT.

Every index of agentrun_run got a new entry at every commit of a turn: the state, which the
reaper's partial indexes had in their predicates, changes at each (running <-> awaiting_tool),
and agentrun_run_finished_idx kept the cost and token columns as keys. Now the partial
indexes select by `phase` (the reaper's class of the state: queued, leased, parked,
finished; states.RUN_PHASE), which a turn does not change; the overview's index is on
`finished_at` alone (the figures are read from the rows); agentrun_run_correlation_idx,
which no query used, goes.

Without rewriting the table or locking it for long, on a table of millions of runs:

1. (Postgres) `phase` as a plain nullable column (no rewrite: adding a generated column
   would rewrite the table under ACCESS EXCLUSIVE), and a trigger that sets it from the
   state on every INSERT and on every UPDATE that changes the state or the phase or finds
   it NULL. One short transaction, under a lock_timeout (retried): it never waits behind a
   long transaction while the table's other users queue behind it. In the model (the
   migration state) the field is a GeneratedField: Django never writes it, reads it back
   after an INSERT (RETURNING), and on SQLite it is one (SQLite remakes the table anyway).
2. (Postgres) The existing rows filled in batches of about BATCH rows, each its own
   transaction (the migration is not atomic), in the table's physical order (TID ranges):
   `SET "state" = "state"`, which the trigger completes; then whatever is still NULL (a row
   an update moved behind the sweep).
3. The new indexes built and the old ones dropped with CREATE / DROP INDEX CONCURRENTLY on
   Postgres (plain operations elsewhere).

bench/migration.py measures it on a generated million-run database (the figures are in
the CHANGELOG and docs/explanation/storage.md).
"""

import time

from django.db import OperationalError, migrations, models, transaction

# Frozen here (states.RUN_PHASE when this was written): the trigger's CASE.
PHASES = {
    "queued": "queued",
    "running": "leased",
    "awaiting_tool": "leased",
    "awaiting_approval": "parked",
}
OTHERWISE = "finished"  # completed, failed, cancelled, timed_out

PHASE_OF_NEW_STATE = (
    'CASE NEW."state" '
    + " ".join(f"WHEN '{state}' THEN '{phase}'" for state, phase in PHASES.items())
    + f" ELSE '{OTHERWISE}' END"
)

# The trigger fires on every UPDATE but does something only where the WHEN says: the
# condition is evaluated without calling the function (a turn's commit that leaves the
# state as it is costs nothing more).
CREATE = [
    'ALTER TABLE "agentrun_run" ADD COLUMN "phase" varchar(8) NULL',
    f"""CREATE OR REPLACE FUNCTION agentrun_run_phase() RETURNS trigger
LANGUAGE plpgsql AS $agentrun_run_phase$
BEGIN
  NEW."phase" := {PHASE_OF_NEW_STATE};
  RETURN NEW;
END
$agentrun_run_phase$""",
    'CREATE TRIGGER agentrun_run_phase_insert BEFORE INSERT ON "agentrun_run" '
    "FOR EACH ROW EXECUTE FUNCTION agentrun_run_phase()",
    'CREATE TRIGGER agentrun_run_phase_update BEFORE UPDATE ON "agentrun_run" FOR EACH ROW '
    'WHEN (NEW."state" IS DISTINCT FROM OLD."state" OR NEW."phase" IS DISTINCT FROM OLD."phase" '
    'OR NEW."phase" IS NULL) EXECUTE FUNCTION agentrun_run_phase()',
]
DROP = [
    'DROP TRIGGER IF EXISTS agentrun_run_phase_update ON "agentrun_run"',
    'DROP TRIGGER IF EXISTS agentrun_run_phase_insert ON "agentrun_run"',
    "DROP FUNCTION IF EXISTS agentrun_run_phase()",
    'ALTER TABLE "agentrun_run" DROP COLUMN IF EXISTS "phase"',
]

# The longest a DDL statement may wait for its lock (everything else on the table waits
# behind it meanwhile); it is tried again a moment later, up to ATTEMPTS times.
LOCK_TIMEOUT = "500ms"
ATTEMPTS = 60
# Rows per backfill transaction (about: a batch is a range of pages): a writer that wants
# one of them waits for the batch's statement (tens of milliseconds).
BATCH = 2000
LOCK_NOT_AVAILABLE = "55P03"


def _postgres(schema_editor):
    return schema_editor.connection.vendor == "postgresql"


def _locked_ddl(schema_editor, statements):
    """`statements` in one transaction that waits at most LOCK_TIMEOUT for its locks."""
    connection = schema_editor.connection
    for attempt in range(ATTEMPTS):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                for statement in statements:
                    cursor.execute(statement)
            return
        except OperationalError as exc:
            code = getattr(exc.__cause__, "sqlstate", None) or getattr(
                exc.__cause__, "pgcode", None
            )
            if code != LOCK_NOT_AVAILABLE or attempt == ATTEMPTS - 1:
                raise
            time.sleep(min(0.1 * (attempt + 1), 2.0))


class AddPhase(migrations.AddField):
    """AddField of the GeneratedField; on Postgres a plain column and its trigger instead."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if not _postgres(schema_editor):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        _locked_ddl(schema_editor, CREATE)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if not _postgres(schema_editor):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        _locked_ddl(schema_editor, DROP)


def backfill(apps, schema_editor):
    """Fill `phase` of the rows there were before the trigger, a page range at a time."""
    if not _postgres(schema_editor):
        return  # a generated column: computed when the table was remade
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size('agentrun_run') / current_setting('block_size')::int, "
            "reltuples FROM pg_class WHERE oid = 'agentrun_run'::regclass"
        )
        pages, tuples = cursor.fetchone()
        per_page = max(float(tuples), 1.0) / max(int(pages), 1) if tuples and tuples > 0 else 10.0
        step = max(1, int(BATCH / max(per_page, 1.0)))
        for first in range(0, int(pages), step):
            cursor.execute(
                'UPDATE "agentrun_run" SET "state" = "state" '
                "WHERE ctid >= %s::tid AND ctid < %s::tid AND \"phase\" IS NULL",
                [f"({first},0)", f"({first + step},0)"],
            )
        # Rows an update moved behind the sweep (or that the table's growth put past it).
        while True:
            cursor.execute(
                'UPDATE "agentrun_run" SET "state" = "state" WHERE "id" IN '
                '(SELECT "id" FROM "agentrun_run" WHERE "phase" IS NULL LIMIT %s)',
                [BATCH],
            )
            if cursor.rowcount == 0:
                break


class AddIndexOnline(migrations.AddIndex):
    """AddIndex, built with CREATE INDEX CONCURRENTLY on Postgres (writes go on meanwhile)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if not _postgres(schema_editor):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if not _postgres(schema_editor):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)


class RemoveIndexOnline(migrations.RemoveIndex):
    """RemoveIndex, with DROP INDEX CONCURRENTLY on Postgres."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if not _postgres(schema_editor):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(
                self.name
            )
            schema_editor.remove_index(model, index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if not _postgres(schema_editor):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            schema_editor.add_index(model, index, concurrently=True)


class Migration(migrations.Migration):
    # Each step its own transaction (the backfill's batches, CONCURRENTLY's builds).
    atomic = False

    dependencies = [
        ("agentrun", "0018_run_cancelling_index"),
    ]

    operations = [
        AddPhase(
            model_name="run",
            name="phase",
            field=models.GeneratedField(
                db_persist=True,
                expression=models.Case(
                    models.When(
                        state__in=["awaiting_tool", "running"], then=models.Value("leased")
                    ),
                    models.When(state__in=["awaiting_approval"], then=models.Value("parked")),
                    models.When(state__in=["queued"], then=models.Value("queued")),
                    default=models.Value("finished"),
                ),
                output_field=models.CharField(
                    choices=[
                        ("queued", "Queued"),
                        ("leased", "Leased"),
                        ("parked", "Parked"),
                        ("finished", "Finished"),
                    ],
                    max_length=8,
                ),
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=False),
        AddIndexOnline(
            model_name="run",
            index=models.Index(
                condition=models.Q(("phase", "leased")),
                fields=["created_at"],
                name="agentrun_run_ph_leased_idx",
            ),
        ),
        AddIndexOnline(
            model_name="run",
            index=models.Index(
                condition=models.Q(("phase", "queued")),
                fields=["queued_at"],
                name="agentrun_run_ph_queued_idx",
            ),
        ),
        AddIndexOnline(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("deadline__isnull", False), ("phase__in", ("leased", "parked", "queued"))
                ),
                fields=["deadline"],
                name="agentrun_run_ph_deadline_idx",
            ),
        ),
        AddIndexOnline(
            model_name="run",
            index=models.Index(
                condition=models.Q(("cancel_requested_at__isnull", False), ("phase", "parked")),
                fields=["cancel_requested_at"],
                name="agentrun_run_ph_cancel_idx",
            ),
        ),
        AddIndexOnline(
            model_name="run",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at"],
                name="agentrun_run_finished_at_idx",
            ),
        ),
        RemoveIndexOnline(model_name="run", name="agentrun_run_leased_idx"),
        RemoveIndexOnline(model_name="run", name="agentrun_run_queued_idx"),
        RemoveIndexOnline(model_name="run", name="agentrun_run_deadline_idx"),
        RemoveIndexOnline(model_name="run", name="agentrun_run_cancelling_idx"),
        RemoveIndexOnline(model_name="run", name="agentrun_run_finished_idx"),
        RemoveIndexOnline(model_name="run", name="agentrun_run_correlation_idx"),
    ]
