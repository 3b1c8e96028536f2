from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    quantity: int
    reorder_level: int = 10  # TODO: make the reorder level configurable per warehouse

    def needs_reorder(self) -> bool:
        return self.quantity <= self.reorder_level
