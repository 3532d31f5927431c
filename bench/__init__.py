"""Benchmarks run by `make bench`; each prints one JSON document with its baseline."""
