"""The pipeline layer: SQL sessions on Spark, DML, change sets and streams."""
