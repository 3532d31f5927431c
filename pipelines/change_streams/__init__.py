"""Partitioned change streams: a table's changes as records an application outside the
warehouse reads in parallel, per key range, in commit order per key (Spanner's change
streams are the reference design).

One module per concept: ``definition`` (the statements), ``watch_list`` (what a stream
watches: tables and their column lists), ``history`` (the definition a change is
reported under: an ALTER applies from its moment on); records, partitions and their
lineage, and the reader follow (issue 20).
"""
