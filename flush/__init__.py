"""Intermediate Parquet writing, the Delta commit protocol and Spark compaction (issues 3-4)."""
