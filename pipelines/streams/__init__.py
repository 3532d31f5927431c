"""Streams' change sets: what changed in a table between two versions.

:mod:`.changes` builds the net change of a table from its change data feed, in one
function whose modes (DEFAULT, APPEND_ONLY, APPEND_ONLY_FINAL) are parameters. Stream
reads, ``CHANGES`` clauses and the transactions that consume streams all read it; it
knows nothing of SQL or of commits.
"""
