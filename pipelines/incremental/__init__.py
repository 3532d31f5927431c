"""The query-delta engine: a query's net change between two versions of its sources,
from Spark's optimized plan (:mod:`.plan` reads it, :mod:`.delta` holds the rules)."""
