import unittest

from shop import Item, total_price

BASKET = [Item("pen", 4, 1.25), Item("notebook", 2, 7.50)]


class TotalPriceTest(unittest.TestCase):
    def test_no_discount(self) -> None:
        self.assertEqual(total_price(BASKET), 20.0)

    def test_percentage_discount(self) -> None:
        self.assertEqual(total_price(BASKET, discount_percent=10), 18.0)

    def test_discount_out_of_range(self) -> None:
        with self.assertRaises(ValueError):
            total_price(BASKET, discount_percent=120)


if __name__ == "__main__":
    unittest.main()
