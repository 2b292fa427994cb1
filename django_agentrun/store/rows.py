"""Rows to statement values and back, without the ORM's per-query compilation (the engine
writes and reads a turn's rows every turn).

- `row_values` / `changes_values`: a model instance (or some of its fields) as the JSON the
  `write` statement takes, through the same preparation a queryset applies;
- `instances`: model instances from `SELECT *` / `RETURNING *` rows, through the fields'
  and the backend's converters, matched by column name.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection, models

from ..fields import StorableJSONEncoder


class _Encoder(StorableJSONEncoder):
    """The storage rule's encoder, with full-precision times (Django's encoder cuts them
    to milliseconds) and UUIDs as the text the columns take."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime | date):
            return o.isoformat()
        if isinstance(o, UUID | Decimal):
            return str(o)
        return super().default(o)


def dumps(value: Any) -> str:
    """JSON for a statement parameter, by the storage rule (fields.py)."""
    return json.dumps(value, cls=_Encoder, separators=(",", ":"))


def _value(field: models.Field, obj: Any) -> Any:
    value = getattr(obj, field.attname)
    if isinstance(field, models.JSONField) or value is None:
        return value
    if isinstance(field, models.CharField | models.TextField | models.BooleanField):
        return value
    if isinstance(field, models.IntegerField | models.DecimalField | models.DateTimeField):
        return value
    return field.get_prep_value(value)


def row_values(obj: Any) -> dict[str, Any]:
    """Every column of `obj` but its primary key (a row to add)."""
    return {f.attname: _value(f, obj) for f in type(obj)._meta.concrete_fields if not f.primary_key}


def changes_values(model: type, changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` (field name -> value) keyed by column, as `write` takes them."""
    out = {}
    for name, value in changes.items():
        field = model._meta.get_field(name)
        if field.is_relation:
            value = getattr(value, "pk", value)
        out[field.attname] = value
    return out


_Plan = tuple[list[str], list[int], list[tuple[int, Any, list[Any]]]]
_PLANS: dict[tuple[str, type, tuple[str, ...]], _Plan] = {}


def _plan(model: type, names: tuple[str, ...]) -> _Plan:
    """The attnames of the model's fields among `names` (in field order; the others are
    deferred), where each is among `names`, and the converters of the columns that need one."""
    key = (connection.vendor, model, names)
    plan = _PLANS.get(key)
    if plan is None:
        position = {name: i for i, name in enumerate(names)}
        fields = [f for f in model._meta.concrete_fields if f.column in position]
        converters = []
        for i, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            funcs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if funcs:
                converters.append((i, col, funcs))
        order = [position[f.column] for f in fields]
        plan = _PLANS[key] = ([f.attname for f in fields], order, converters)
    return plan


def instances(model: type, names: tuple[str, ...], rows: list[tuple]) -> list[Any]:
    """Model instances from rows whose columns are `names` (a cursor's description, in the
    table's order, which need not be the model's; columns left out are deferred), through
    the fields' and the backend's converters (what a queryset applies)."""
    attnames, order, converters = _plan(model, names)
    alias = connection.alias
    out = []
    for row in rows:
        values = [row[i] for i in order]
        for i, col, funcs in converters:
            value = values[i]
            for func in funcs:
                value = func(value, col, connection)
            values[i] = value
        out.append(model.from_db(alias, attnames, values))
    return out


def column_names(cursor: Any) -> tuple[str, ...]:
    return tuple(d[0] for d in cursor.description)
