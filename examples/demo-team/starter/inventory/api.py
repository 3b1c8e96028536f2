from inventory.store import load_items, reorder_report

DEFAULT_DATA = "data/stock.csv"


def handle_report(path: str = DEFAULT_DATA) -> dict:
    from pathlib import Path

    items = load_items(Path(path))
    return {"count": len(items), "reorder": reorder_report(items)}  # TODO: paginate large reports
