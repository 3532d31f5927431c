"""Runnable examples built on the public SDK only."""
