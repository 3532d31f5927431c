"""Intermediate Parquet writing, the Delta commit protocol and Spark compaction. Built in issues 3-4."""
