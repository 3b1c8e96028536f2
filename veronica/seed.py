"""The demo space and login that `up` seeds idempotently, and the demo goal."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings

DEMO_MANIFEST = Path(settings.BASE_DIR) / "examples" / "demo-team"
DEMO_GOAL = """Review inventory/models.py and inventory/store.py for how the reorder rule works
Find TODO and FIXME notes in inventory/
Check data/stock.csv against docs/design.md"""
