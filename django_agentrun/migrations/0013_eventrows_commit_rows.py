"""One RunEvent row per commit (issue #26): a run's events are stored in `RunEventRow`, a
row per commit holding its events as one JSON array with the seqs they take (`seq` to
`seq_to`, gap-free across a run's rows), and read one per seq through the view
`agentrun_event` (the model `RunEvent`, unmanaged), so no reader sees the change.

Forward: the new table, existing events copied into it (a run's consecutive events written
at the same time, as one commit writes them, share a row), the old table dropped, the view
made, the engine's write function (queries.sql `write_function`, a frozen copy below) writing
one row per commit. Backward: the table of one row per event again, filled from the rows,
and 0012's function. Also room for HOT updates of the run's row, updated at every commit
of a step: the leased runs' partial index on created_at (no update changes it) instead of
lease_expires_at, and (Postgres only) fillfactor 70.
"""

import importlib

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

import django_agentrun.fields

ID_SPAN = 1_000_000

VIEW = {
    "postgresql": """
CREATE VIEW "agentrun_event" AS
SELECT r."id" * %(span)d + (e.i - 1) AS "id", r."run_id", r."seq" + (e.i - 1)::integer AS "seq",
       (e.ev ->> 0)::varchar(64) AS "type", e.ev -> 1 AS "payload", r."created_at"
FROM "agentrun_runeventrow" AS r
CROSS JOIN LATERAL jsonb_array_elements(r."events") WITH ORDINALITY AS e(ev, i)
""",
    "sqlite": """
CREATE VIEW "agentrun_event" AS
SELECT r."id" * %(span)d + e."key" AS "id", r."run_id", r."seq" + e."key" AS "seq",
       e."value" ->> '$[0]' AS "type", e."value" -> '$[1]' AS "payload", r."created_at"
FROM "agentrun_runeventrow" AS r, json_each(r."events") AS e
""",
}

# The run row, updated at every commit of a step: room on each page for the new version of
# a row updated in place (HOT), and its large values (config, input...) kept out of line
# (TOAST) above 128 bytes, so that an update writes (and logs) a short row and leaves them
# where they are. The same for a turn's content (its row is updated when the turn ends).
STORAGE = [
    'ALTER TABLE "agentrun_run" SET (fillfactor = 70, toast_tuple_target = 128)',
    'ALTER TABLE "agentrun_turn" SET (toast_tuple_target = 128)',
]
STORAGE_RESET = [
    'ALTER TABLE "agentrun_run" RESET (fillfactor, toast_tuple_target)',
    'ALTER TABLE "agentrun_turn" RESET (toast_tuple_target)',
]

FUNCTION = r"""
CREATE OR REPLACE FUNCTION agentrun_write(
  p_run_id uuid,
  p_expected_state text,
  p_epoch bigint,
  p_owner text,
  p_lease text,
  p_lease_seconds double precision,
  p_run_changes jsonb,
  p_input_tokens bigint,
  p_output_tokens bigint,
  p_cache_creation_input_tokens bigint,
  p_cache_read_input_tokens bigint,
  p_cost_usd numeric,
  p_turn_count integer,
  p_turns_added jsonb,
  p_turns_changed jsonb,
  p_turns_changed_count integer,
  p_calls_added jsonb,
  p_calls_changed jsonb,
  p_calls_changed_count integer,
  p_events jsonb,
  p_event_count integer
) RETURNS TABLE (
  last_seq integer,
  cancel_requested_at timestamptz,
  lease_expires_at timestamptz,
  turn_ids jsonb,
  call_ids jsonb
) LANGUAGE plpgsql AS $agentrun_write$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH
run_locked AS MATERIALIZED (
  SELECT "id" FROM "agentrun_run" WHERE "id" = p_run_id FOR NO KEY UPDATE
),
turns_changed AS (
  UPDATE "agentrun_turn" AS t SET
    "state" = CASE WHEN v.changes ? 'state' THEN p."state" ELSE t."state" END,
    "content" = CASE WHEN v.changes ? 'content' THEN p."content" ELSE t."content" END,
    "message_id" = CASE WHEN v.changes ? 'message_id' THEN p."message_id" ELSE t."message_id" END,
    "request_id" = CASE WHEN v.changes ? 'request_id' THEN p."request_id" ELSE t."request_id" END,
    "model" = CASE WHEN v.changes ? 'model' THEN p."model" ELSE t."model" END,
    "stop_reason" = CASE WHEN v.changes ? 'stop_reason' THEN p."stop_reason" ELSE t."stop_reason" END,
    "model_attempts" = CASE WHEN v.changes ? 'model_attempts' THEN p."model_attempts" ELSE t."model_attempts" END,
    "usage_details" = CASE WHEN v.changes ? 'usage_details' THEN p."usage_details" ELSE t."usage_details" END,
    "prefix" = CASE WHEN v.changes ? 'prefix' THEN p."prefix" ELSE t."prefix" END,
    "input_tokens" = CASE WHEN v.changes ? 'input_tokens' THEN p."input_tokens" ELSE t."input_tokens" END,
    "output_tokens" = CASE WHEN v.changes ? 'output_tokens' THEN p."output_tokens" ELSE t."output_tokens" END,
    "cache_creation_input_tokens" = CASE WHEN v.changes ? 'cache_creation_input_tokens' THEN p."cache_creation_input_tokens" ELSE t."cache_creation_input_tokens" END,
    "cache_read_input_tokens" = CASE WHEN v.changes ? 'cache_read_input_tokens' THEN p."cache_read_input_tokens" ELSE t."cache_read_input_tokens" END,
    "finished_at" = CASE WHEN v.changes ? 'finished_at' THEN p."finished_at" ELSE t."finished_at" END
  FROM run_locked,
       (SELECT * FROM jsonb_to_recordset(p_turns_changed)
          AS x("id" bigint, "expected" text, "changes" jsonb)
        LIMIT p_turns_changed_count) AS v,
       LATERAL jsonb_populate_record(NULL::"agentrun_turn", v.changes) AS p
  WHERE t."id" = v."id" AND (v."expected" IS NULL OR t."state" = v."expected")
  RETURNING t."id"
),
turns_added AS (
  INSERT INTO "agentrun_turn" (
    "run_id", "index", "state", "is_final", "content", "message_id", "request_id", "model",
    "stop_reason", "model_attempts", "usage_details", "prefix", "input_tokens", "output_tokens",
    "cache_creation_input_tokens", "cache_read_input_tokens", "started_at", "finished_at"
  )
  SELECT p."run_id", p."index", p."state", p."is_final", p."content", p."message_id",
         p."request_id", p."model", p."stop_reason", p."model_attempts",
         COALESCE(p."usage_details", '{}'::jsonb), COALESCE(p."prefix", ''), p."input_tokens",
         p."output_tokens", p."cache_creation_input_tokens", p."cache_read_input_tokens",
         p."started_at", p."finished_at"
  FROM jsonb_array_elements(p_turns_added) AS v(row),
       LATERAL jsonb_populate_record(NULL::"agentrun_turn", v.row) AS p
  RETURNING "id", "index"
),
calls_changed AS (
  UPDATE "agentrun_toolcall" AS c SET
    "state" = CASE WHEN v.changes ? 'state' THEN p."state" ELSE c."state" END,
    "attempt" = CASE WHEN v.changes ? 'attempt' THEN p."attempt" ELSE c."attempt" END,
    "started_at" = CASE WHEN v.changes ? 'started_at' THEN p."started_at" ELSE c."started_at" END,
    "heartbeat_at" = CASE WHEN v.changes ? 'heartbeat_at' THEN p."heartbeat_at" ELSE c."heartbeat_at" END,
    "finished_at" = CASE WHEN v.changes ? 'finished_at' THEN p."finished_at" ELSE c."finished_at" END,
    "result" = CASE WHEN v.changes ? 'result' THEN p."result" ELSE c."result" END,
    "result_format" = CASE WHEN v.changes ? 'result_format' THEN p."result_format" ELSE c."result_format" END,
    "is_error" = CASE WHEN v.changes ? 'is_error' THEN p."is_error" ELSE c."is_error" END,
    "result_source" = CASE WHEN v.changes ? 'result_source' THEN p."result_source" ELSE c."result_source" END,
    "unknown_reason" = CASE WHEN v.changes ? 'unknown_reason' THEN p."unknown_reason" ELSE c."unknown_reason" END,
    "approved" = CASE WHEN v.changes ? 'approved' THEN p."approved" ELSE c."approved" END,
    "approval_payload" = CASE WHEN v.changes ? 'approval_payload' THEN p."approval_payload" ELSE c."approval_payload" END,
    "approval_deadline" = CASE WHEN v.changes ? 'approval_deadline' THEN p."approval_deadline" ELSE c."approval_deadline" END,
    "decided_by_id" = CASE WHEN v.changes ? 'decided_by_id' THEN p."decided_by_id" ELSE c."decided_by_id" END,
    "decided_at" = CASE WHEN v.changes ? 'decided_at' THEN p."decided_at" ELSE c."decided_at" END,
    "decision_note" = CASE WHEN v.changes ? 'decision_note' THEN p."decision_note" ELSE c."decision_note" END,
    "arguments" = CASE WHEN v.changes ? 'arguments' THEN p."arguments" ELSE c."arguments" END,
    "arguments_hash" = CASE WHEN v.changes ? 'arguments_hash' THEN p."arguments_hash" ELSE c."arguments_hash" END,
    "original_arguments" = CASE WHEN v.changes ? 'original_arguments' THEN p."original_arguments" ELSE c."original_arguments" END
  FROM run_locked,
       (SELECT * FROM jsonb_to_recordset(p_calls_changed)
          AS x("id" bigint, "expected" text, "changes" jsonb)
        LIMIT p_calls_changed_count) AS v,
       LATERAL jsonb_populate_record(NULL::"agentrun_toolcall", v.changes) AS p
  WHERE c."id" = v."id" AND (v."expected" IS NULL OR c."state" = v."expected")
  RETURNING c."id"
),
calls_added AS (
  INSERT INTO "agentrun_toolcall" (
    "run_id", "turn_id", "turn_index", "tool_call_id", "position", "name", "arguments",
    "arguments_hash", "side_effect", "idempotency_key", "state", "attempt", "started_at",
    "heartbeat_at", "finished_at", "result", "result_format", "is_error", "result_source",
    "unknown_reason", "approved", "approval_payload", "approval_deadline", "decided_by_id",
    "decided_at", "decision_note", "original_arguments", "created_at"
  )
  SELECT p."run_id",
         COALESCE(p."turn_id", (SELECT a."id" FROM turns_added a WHERE a."index" = p."turn_index")),
         p."turn_index", p."tool_call_id", p."position", p."name", p."arguments",
         p."arguments_hash", p."side_effect", p."idempotency_key", p."state", p."attempt",
         p."started_at", p."heartbeat_at", p."finished_at", p."result", p."result_format",
         p."is_error", p."result_source", p."unknown_reason", p."approved",
         p."approval_payload", p."approval_deadline", p."decided_by_id", p."decided_at",
         p."decision_note", p."original_arguments", p."created_at"
  FROM jsonb_array_elements(p_calls_added) AS v(row),
       LATERAL jsonb_populate_record(NULL::"agentrun_toolcall", v.row) AS p
  RETURNING "id", "turn_index", "position"
),
r AS (
  UPDATE "agentrun_run" AS r SET
    "state" = CASE WHEN s.changes ? 'state' THEN p."state" ELSE r."state" END,
    "lease_owner" = CASE WHEN s.changes ? 'lease_owner' THEN p."lease_owner" ELSE r."lease_owner" END,
    "lease_expires_at" = CASE p_lease
        WHEN 'now' THEN statement_timestamp()
        WHEN 'renew' THEN statement_timestamp() + p_lease_seconds * interval '1 second'
        ELSE r."lease_expires_at" END,
    "recovery_attempts" = CASE WHEN s.changes ? 'recovery_attempts' THEN p."recovery_attempts" ELSE r."recovery_attempts" END,
    "output" = CASE WHEN s.changes ? 'output' THEN p."output" ELSE r."output" END,
    "parsed_output" = CASE WHEN s.changes ? 'parsed_output' THEN p."parsed_output" ELSE r."parsed_output" END,
    "stop_reason" = CASE WHEN s.changes ? 'stop_reason' THEN p."stop_reason" ELSE r."stop_reason" END,
    "error_code" = CASE WHEN s.changes ? 'error_code' THEN p."error_code" ELSE r."error_code" END,
    "error_message" = CASE WHEN s.changes ? 'error_message' THEN p."error_message" ELSE r."error_message" END,
    "failure_phase" = CASE WHEN s.changes ? 'failure_phase' THEN p."failure_phase" ELSE r."failure_phase" END,
    "last_checkpoint" = CASE WHEN s.changes ? 'last_checkpoint' THEN p."last_checkpoint" ELSE r."last_checkpoint" END,
    "cancel_requested_at" = CASE WHEN s.changes ? 'cancel_requested_at' THEN p."cancel_requested_at" ELSE r."cancel_requested_at" END,
    "cancel_reason" = CASE WHEN s.changes ? 'cancel_reason' THEN p."cancel_reason" ELSE r."cancel_reason" END,
    "cancel_requested_by_id" = CASE WHEN s.changes ? 'cancel_requested_by_id' THEN p."cancel_requested_by_id" ELSE r."cancel_requested_by_id" END,
    "deadline" = CASE WHEN s.changes ? 'deadline' THEN p."deadline" ELSE r."deadline" END,
    "queued_at" = CASE WHEN s.changes ? 'queued_at' THEN p."queued_at" ELSE r."queued_at" END,
    "started_at" = CASE WHEN s.changes ? 'started_at' THEN p."started_at" ELSE r."started_at" END,
    "finished_at" = CASE WHEN s.changes ? 'finished_at' THEN p."finished_at" ELSE r."finished_at" END,
    "rolled_back" = CASE WHEN s.changes ? 'rolled_back' THEN p."rolled_back" ELSE r."rolled_back" END,
    "input_tokens" = r."input_tokens" + p_input_tokens,
    "output_tokens" = r."output_tokens" + p_output_tokens,
    "cache_creation_input_tokens" = r."cache_creation_input_tokens" + p_cache_creation_input_tokens,
    "cache_read_input_tokens" = r."cache_read_input_tokens" + p_cache_read_input_tokens,
    "cost_usd" = r."cost_usd" + p_cost_usd,
    "turn_count" = r."turn_count" + p_turn_count,
    "last_seq" = r."last_seq" + p_event_count,
    "updated_at" = statement_timestamp()
  FROM (SELECT p_run_changes AS changes) AS s,
       LATERAL jsonb_populate_record(NULL::"agentrun_run", s.changes) AS p
  WHERE r."id" = p_run_id
    AND (p_expected_state IS NULL OR r."state" = p_expected_state)
    AND (p_epoch IS NULL
         OR (r."lease_epoch" = p_epoch AND r."lease_owner" = p_owner))
    AND (SELECT count(*) FROM turns_changed) = p_turns_changed_count
    AND (SELECT count(*) FROM calls_changed) = p_calls_changed_count
  RETURNING r."last_seq", r."cancel_requested_at", r."lease_expires_at"
),
events AS (
  INSERT INTO "agentrun_runeventrow" ("run_id", "seq", "seq_to", "events", "created_at")
  SELECT p_run_id,
         COALESCE((SELECT r."last_seq" FROM r) - p_event_count + 1, 1),
         COALESCE((SELECT r."last_seq" FROM r), 1),
         p_events, statement_timestamp()
  WHERE p_event_count > 0
)
SELECT r."last_seq", r."cancel_requested_at", r."lease_expires_at",
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(a."index", a."id")), '[]') FROM turns_added a),
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(a."turn_index", a."position", a."id")), '[]')
          FROM calls_added a)
FROM r;
END
$agentrun_write$
"""


def _vendor(schema_editor) -> str:
    vendor = schema_editor.connection.vendor
    if vendor not in VIEW:
        raise NotImplementedError(f"django-agentrun runs on Postgres or SQLite, not {vendor}")
    return vendor


def forward(apps, schema_editor):
    _vendor(schema_editor)
    old = apps.get_model("agentrun", "RunEvent")
    Row = apps.get_model("agentrun", "RunEventRow")
    db = schema_editor.connection.alias
    batch, group = [], []

    def close():
        if group:
            first = group[0]
            batch.append(
                Row(
                    run_id=first.run_id,
                    seq=first.seq,
                    seq_to=group[-1].seq,
                    events=[[e.type, e.payload] for e in group],
                    created_at=first.created_at,
                )
            )
            group.clear()
        if len(batch) >= 500:
            Row.objects.using(db).bulk_create(batch)
            batch.clear()

    for event in old.objects.using(db).order_by("run_id", "seq").iterator(chunk_size=2000):
        last = group[-1] if group else None
        if not (
            last is not None
            and last.run_id == event.run_id
            and last.seq + 1 == event.seq
            and last.created_at == event.created_at
        ):
            close()
        group.append(event)
    close()
    Row.objects.using(db).bulk_create(batch)
    schema_editor.delete_model(old)


def make_view(apps, schema_editor):
    vendor = _vendor(schema_editor)
    schema_editor.execute(VIEW[vendor] % {"span": ID_SPAN})
    if vendor == "postgresql":
        schema_editor.execute(FUNCTION)
        for statement in STORAGE:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    _vendor(schema_editor)
    old = apps.get_model("agentrun", "RunEvent")
    Row = apps.get_model("agentrun", "RunEventRow")
    db = schema_editor.connection.alias
    schema_editor.create_model(old)
    batch = []
    for row in Row.objects.using(db).order_by("run_id", "seq").iterator(chunk_size=500):
        for i, (kind, payload) in enumerate(row.events):
            batch.append(
                old(
                    run_id=row.run_id,
                    seq=row.seq + i,
                    type=kind,
                    payload=payload,
                    created_at=row.created_at,
                )
            )
        if len(batch) >= 2000:
            old.objects.using(db).bulk_create(batch)
            batch.clear()
    old.objects.using(db).bulk_create(batch)


def drop_view(apps, schema_editor):
    vendor = _vendor(schema_editor)
    schema_editor.execute('DROP VIEW "agentrun_event"')
    if vendor == "postgresql":
        previous = importlib.import_module("django_agentrun.migrations.0012_pooler_write_function")
        schema_editor.execute(previous.FUNCTION)
        for statement in STORAGE_RESET:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0012_pooler_write_function"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The leased runs' index on a column no update changes (HOT updates of the run).
        migrations.RemoveIndex(model_name="run", name="agentrun_run_leased_idx"),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("state__in", ["running", "awaiting_tool"])),
                fields=["created_at"],
                name="agentrun_run_leased_idx",
            ),
        ),
        migrations.CreateModel(
            name="RunEventRow",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seq", models.PositiveIntegerField()),
                ("seq_to", models.PositiveIntegerField()),
                (
                    "events",
                    models.JSONField(
                        decoder=django_agentrun.fields.StorableJSONDecoder,
                        default=list,
                        encoder=django_agentrun.fields.StorableJSONEncoder,
                    ),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="event_rows",
                        to="agentrun.run",
                    ),
                ),
            ],
            options={"ordering": ["run", "seq"], "base_manager_name": "objects"},
        ),
        # Before RunEvent's state changes: both ways see the table of one row per event.
        migrations.RunPython(forward, backward, elidable=False),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="runevent", name="agentrun_runevent_seq"),
                migrations.AlterField(
                    model_name="runevent",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="events",
                        to="agentrun.run",
                    ),
                ),
                migrations.AlterModelOptions(
                    name="runevent",
                    options={
                        "base_manager_name": "objects",
                        "managed": False,
                        "ordering": ["run", "seq"],
                    },
                ),
                migrations.AlterModelTable(name="runevent", table="agentrun_event"),
            ],
        ),
        migrations.AddConstraint(
            model_name="runeventrow",
            constraint=models.UniqueConstraint(fields=("run", "seq"), name="agentrun_runevent_seq"),
        ),
        # After the constraint: SQLite adds it by making the table anew, which a view on it
        # would refuse.
        migrations.RunPython(make_view, drop_view, elidable=False),
    ]
