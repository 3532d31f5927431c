"""The command line's client side, kept light: ``python -m pipelines --url`` imports only
this package, :mod:`pipelines.errors` and :mod:`pipelines.sql.statements` (no Spark, no
Delta, no Arrow), so a statement answers in about the time the service takes.

:mod:`.split` cuts input into statements, :mod:`.service` talks to ``POST /v1/sql`` and
:mod:`.output` prints rows and errors; ``pipelines.__main__`` puts them together with the
local Spark session and ``tail``.
"""
