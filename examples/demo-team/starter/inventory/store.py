import csv
from pathlib import Path

from inventory.models import Item


def load_items(path: Path) -> list[Item]:
    with path.open() as handle:
        rows = csv.DictReader(handle)
        return [Item(r["sku"], r["name"], int(r["quantity"]), int(r["reorder_level"])) for r in rows]


def reorder_report(items: list[Item]) -> list[str]:
    # FIXME: items with a negative quantity are silently reported as needing a reorder
    return [f"{i.sku} {i.name}: {i.quantity} left" for i in items if i.needs_reorder()]
