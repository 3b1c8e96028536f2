"""The demo space and login that `up` seeds idempotently, and the demo goal."""
from __future__ import annotations

DEMO_TEMPLATE = "demo-team"  # examples/demo-team/: the demo runs on its own copy, never in the checkout
DEMO_SLUG = "demo"
DEMO_GOAL = """Review inventory/models.py and inventory/store.py for how the reorder rule works
Find TODO and FIXME notes in inventory/
Check data/stock.csv against docs/design.md"""
