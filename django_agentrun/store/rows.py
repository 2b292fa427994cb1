"""Rows back from statements, without the ORM's per-query compilation (the engine reads a
run's turns and calls at every claim).

- `instances`: model instances from `SELECT *` / `RETURNING *` rows, through the fields'
  and the backend's converters, matched by column name;
- `orm_rows`: a queryset's rows as a statement's (`Result`: column names, rows), for the
  portable store.

(A row as the JSON the `write` statement takes is postgres.py's.)
"""

from __future__ import annotations

from typing import Any

from django.db import connection

# A statement's result: its column names and its rows.
Result = tuple[tuple[str, ...], list[tuple]]


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


def orm_rows(queryset: Any, only: tuple[str, ...] | None = None) -> Result:
    """The rows of `queryset` (all the model's columns, or those of the fields `only`)."""
    fields = [f for f in queryset.model._meta.concrete_fields if only is None or f.name in only]
    names = tuple(f.column for f in fields)
    sql_text, params = queryset.values_list(*(f.attname for f in fields)).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql_text, params)
        return names, cursor.fetchall()
