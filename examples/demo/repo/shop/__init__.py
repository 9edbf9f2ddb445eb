"""Prices for a very small shop."""

from .pricing import Item, total_price

__all__ = ["Item", "total_price"]
