"""SELECTs of a run's start, compiled by the ORM once per shape and then only executed.

A run reads a dozen small things before its first model call (its member and space, its open session,
its transcript, skills, memory, MCP servers, ...). Compiling each queryset cost far more client CPU
than running it (0.3-1 ms each on a loaded host, for queries that return no row or a few), on the
path every run takes. Here a queryset is built once with sentinel values (veronica.plumbing.returning's
Sentinels) and compiled to SQL; each call binds its own values in place of the sentinels and builds
the model instances from the rows, through the same database converters the ORM would apply.

Only plain model querysets (optionally with select_related): every selected column is a concrete field
of the model (then of each related model, in order), checked when the shape is compiled.
"""
from __future__ import annotations

from typing import Any, Callable

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet

from veronica.plumbing.returning import Sentinels, _hashable, bound

_cache: dict[tuple, tuple] = {}


def _compiled(key: tuple, build: Callable[[Sentinels], QuerySet]):
    connection = connections[DEFAULT_DB_ALIAS]
    cache_key = (connection.vendor, *key)
    cached = _cache.get(cache_key)
    if cached is None:
        slots = Sentinels()
        qs = build(slots)
        compiler = qs.query.get_compiler(DEFAULT_DB_ALIAS)
        sql, params = compiler.as_sql()
        params = list(params)
        bind = {i: slots.names[p] for i, p in enumerate(params) if not isinstance(p, bool) and _hashable(p) and p in slots.names}
        if len(set(bind.values())) != len(set(slots.names.values())):
            raise RuntimeError(f"compiled select {key}: a sentinel did not survive compilation")
        columns = [col for col, _, _ in compiler.select]
        related = _related(compiler.klass_info)
        models = [qs.model] + [f.related_model for f in related]
        expected = [f for model in models for f in model._meta.concrete_fields]
        if compiler.query.annotation_select or [getattr(c, "target", None) for c in columns] != expected:
            raise RuntimeError(f"compiled select {key}: only plain model columns are supported")
        if len(_cache) > 256:
            _cache.clear()
        cached = _cache[cache_key] = (sql, params, bind, columns, models, related)
    return cached


def _related(klass_info) -> list:
    """The select_related fields, in the order their columns follow the model's (one level deep)."""
    related = (klass_info or {}).get("related_klass_infos") or []
    if any(info.get("related_klass_infos") for info in related):
        raise RuntimeError("compiled select: select_related one level deep only")
    return [info["field"] for info in related]


def fetch(key: tuple, build: Callable[[Sentinels], QuerySet], values: dict[str, Any]) -> list[Model]:
    """Run the SELECT that build(sentinels) describes (key names its shape) with `values` bound in place
    of the sentinels: the model instances, each with its select_related instances attached."""
    sql, params, bind, columns, models, related = _compiled(key, build)
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cur:
        cur.execute(sql, bound((sql, params, bind), values))
        raw = cur.fetchall()
    return instances(key, build, raw)


# Per shape: which columns have database converters, and each model's width. Asking every column for
# its converters on every call cost as much as building the instances (a claim's member row has ~60).
_converters_cache: dict[tuple, tuple[list, list]] = {}


def _converters(key: tuple, connection, columns: list, models: list) -> tuple[list, list]:
    cache_key = (connection.vendor, *key)
    found = _converters_cache.get(cache_key)
    if found is None:
        converters = [(i, convs) for i, col in enumerate(columns)
                      if (convs := connection.ops.get_db_converters(col) + col.get_db_converters(connection))]
        if len(_converters_cache) > 256:
            _converters_cache.clear()
        found = _converters_cache[cache_key] = (converters, [len(model._meta.concrete_fields) for model in models])
    return found


def instances(key: tuple, build: Callable[[Sentinels], QuerySet], raw: list) -> list[Model]:
    """Model instances (each with its select_related ones attached) from rows some other statement
    returned with exactly the columns of this shape's SELECT, in its order (e.g. an UPDATE's RETURNING)."""
    _, _, _, columns, models, related = _compiled(key, build)
    connection = connections[DEFAULT_DB_ALIAS]
    if not raw:
        return []
    converters, widths = _converters(key, connection, columns, models)
    alias = connection.alias
    out = []
    for row in raw:
        row = list(row)
        for i, convs in converters:
            for convert in convs:
                row[i] = convert(row[i], columns[i], connection)
        start, objs = 0, []
        for model, width in zip(models, widths):
            values_ = row[start:start + width]
            objs.append(model.from_db(alias, None, values_) if values_[0] is not None or start == 0 else None)
            start += width
        for field, obj in zip(related, objs[1:]):
            field.set_cached_value(objs[0], obj)
        out.append(objs[0])
    return out
