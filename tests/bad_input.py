"""The bad-input battery's yardstick: the whole stored state, to prove a refused input wrote nothing.

PostgreSQL refuses NUL in text and jsonb while SQLite stores it, so every check must be ours: the
battery runs unchanged in both modes and expects the same 4xx from each.
"""
from __future__ import annotations

from django.apps import apps

NUL = "\x00"
SURROGATE = "\ud800"  # a lone surrogate: a Python str, but not encodable as UTF-8
APPS = ("veronica", "learning", "waggle", "django_q")


def db_state() -> dict[str, list[dict]]:
    """Every row of every model the product owns (the test tables are small)."""
    state = {}
    for label in APPS:
        for model in apps.get_app_config(label).get_models():
            rows = model.objects.order_by("pk")
            if model._meta.label == "veronica.AuditRow":  # a test client's force_login is a login row; a refused change writes none
                rows = rows.exclude(action="login")
            state[model._meta.label] = list(rows.values())
    return state


def changed_tables(before: dict, after: dict) -> list[str]:
    return [name for name in before if before[name] != after.get(name)]
