"""Transactions and the consumer commit: how a transaction's writes and the streams it
consumed become durable together, once, across any number of Delta tables.

:mod:`.transaction` pins the versions a transaction reads and stages what it writes;
:mod:`.commit` is the consumer commit (reserve write intents, validate, decide in the
catalog, roll forward) and the recovery of decided commits; :mod:`.commit_owner` tells
whether a pending commit's owner process is alive. Nothing here knows SQL: a statement
handler hands a transaction its change sets, so other consumers (dynamic-table
refreshes, later) can commit through the same function.
"""
