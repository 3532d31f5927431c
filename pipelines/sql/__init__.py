"""The SQL face: the statements a session accepts and one handler per statement.

A statement is classified by its header (:mod:`.statements`) and handed to its handler:
the registry in :mod:`.ddl` (tables, streams, databases and schemas in :mod:`.ddl_schemas`,
CREATE TABLE ... AS, TRUNCATE and EXPLAIN in :mod:`.ddl_queries`, DESCRIBE HISTORY in
:mod:`.history`) or the DML runners of :mod:`.dml`. Queries are bound to our objects by
:mod:`.binding` and checked by the plan guard (:mod:`.plan_guard`, its allowlist in
:mod:`.plan_classes`) before Spark runs them.

Handlers and the binder see the session (:mod:`pipelines.session`, above this package)
only as a :class:`.context.StatementContext`. This package's ``__init__`` imports
nothing: :mod:`.statements` is light and is imported without Spark (the command line's
``--url`` mode, the service's HTTP side).
"""
