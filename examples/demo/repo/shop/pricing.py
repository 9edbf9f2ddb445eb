"""Order totals."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    name: str
    quantity: int
    unit_price: float


def total_price(items: list[Item], discount_percent: float = 0) -> float:
    """The order's total: quantity times unit price, less a percentage discount, in cents."""
    if not 0 <= discount_percent <= 100:
        raise ValueError("discount_percent must be between 0 and 100")
    subtotal = sum(item.quantity * item.unit_price for item in items)
    discount = subtotal * discount_percent
    return round(subtotal - discount, 2)
