"""Django for a bench script, on a throwaway SQLite database under data/.

DATABASE_URL and REDIS_URL are ignored, so a bench never touches a real database; the database is
migrated on entry and its folder removed on exit. Bench scripts run as files (`python bench/x.py`),
so they import this as `from throwaway import throwaway_django`.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def throwaway_django(prefix: str) -> Iterator[str]:
    """Yields the data folder (VERONICA_DATA_DIR) of a fresh, migrated database."""
    (ROOT / "data").mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=ROOT / "data")
    os.environ["VERONICA_DATA_DIR"] = tmp
    for var in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(var, None)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "veronica.settings"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield tmp
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django never set up: nothing to close
            pass
        shutil.rmtree(tmp, ignore_errors=True)
