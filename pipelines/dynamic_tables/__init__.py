"""Dynamic tables: a table whose content is a query's result, kept within a target
lag of its sources by refreshes the scheduler runs.

One module per concept: ``classify`` (incremental or full, from Spark's analyzed
plan), ``schedule`` (refresh periods and aligned refresh times, pure functions of a
clock); definition, refresh and history follow (issue 19).
"""
