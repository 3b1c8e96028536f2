"""Inventory: items, stock levels and reorder rules."""
