"""Streams' change sets: what changed in a table between two versions.

:mod:`.changes` reads a table's change data feed between two versions (delta-rs) and
nets it with :func:`pipelines.change_sets.net_events` (the modes DEFAULT, APPEND_ONLY,
APPEND_ONLY_FINAL are its parameters). Stream reads, ``CHANGES`` clauses and the
transactions that consume streams all read it; it knows nothing of SQL or of commits.
"""
