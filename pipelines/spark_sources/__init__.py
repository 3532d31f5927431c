"""The PySpark data sources: ``format("ingest-changes")`` (:mod:`.change_source`, a
table's change rows by version, batch and streaming) and ``format("ingest")``
(:mod:`.table_sink`, appends with each micro-batch committed once), and the options
both read (:mod:`.source_options`).

Spark loads these classes in its Python workers, so they use the catalog and ``flush``
directly, never a SQL session. ``pipelines.register_data_sources`` registers both.
"""
