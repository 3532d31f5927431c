"""The start-up check: every mapping must fit its table before a single record is consumed.

Why refuse to start rather than dead-letter: a mapping that names a missing column makes
*every* record fail conversion, and because the offset token still covers bad records, the
channels' tokens move past records that never became rows. Re-reading them later means
resetting tokens by hand. Checking the mapping against the columns the service reports
(``GET /v1/tables/{name}`` answers ``columns``) costs one request per table and turns
that silent loss into an error message at start-up.

What can be checked without seeing a record: the table exists, every metadata column
exists, no two metadata fields share a column, and each metadata column's type can hold
what the bridge stores in it. Record values cannot be checked ahead: their keys are
whatever the producers send.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from examples.kafka_bridge.errors import BridgeError, ConfigurationError
from ingest_sdk import IngestError, SchemaError, TableNotFoundError, TableSchema, TypeKind
from ingest_sdk.schema import split_table_name

if TYPE_CHECKING:
    from examples.kafka_bridge.bridge import TopicMapping
    from ingest_sdk import StreamingIngestClient

__all__ = ["METADATA_KINDS", "SUGGESTED_TYPES", "check_tables", "mapping_problems"]

_TEXT = frozenset({TypeKind.VARCHAR, TypeKind.VARIANT})
_NUMBER = frozenset({TypeKind.NUMBER, TypeKind.FLOAT, TypeKind.VARCHAR, TypeKind.VARIANT})
_TIMESTAMPS = frozenset({TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ, TypeKind.TIMESTAMP_TZ})

#: Column kinds that hold each Kafka metadata field without losing its meaning. Kinds the
#: converter would accept but misread are left out on purpose: an offset into BOOLEAN
#: converts (0 is false) and a partition into DATE converts (an epoch), both to nonsense.
METADATA_KINDS: dict[str, frozenset[TypeKind]] = {
    "topic": _TEXT,
    "partition": _NUMBER,
    "offset": _NUMBER,
    "timestamp": _NUMBER | _TIMESTAMPS,  # milliseconds since the epoch
    "key": _TEXT | {TypeKind.NUMBER},  # numeric keys are common; text keys fail per record
    "headers": frozenset({TypeKind.OBJECT, TypeKind.VARIANT}),  # a JSON object
}

#: What the error message suggests declaring for a missing metadata column.
SUGGESTED_TYPES = {
    "topic": "VARCHAR(249)",
    "partition": "NUMBER(9,0)",
    "offset": "NUMBER(18,0)",
    "timestamp": "TIMESTAMP_LTZ(3)",
    "key": "VARCHAR",
    "headers": "OBJECT",
}


def mapping_problems(mapping: TopicMapping, schema: TableSchema) -> list[str]:
    """What keeps ``mapping`` from fitting a table with ``schema``, one sentence each with
    the fix; empty when it fits."""
    problems: list[str] = []
    where = f"table {mapping.table} (topic {mapping.topic})"
    unknown = sorted(set(mapping.metadata_columns) - set(METADATA_KINDS))
    if unknown:
        problems.append(
            f"{where}: unknown metadata field(s) {', '.join(unknown)}. "
            f"Fix: use {', '.join(METADATA_KINDS)}"
        )
    fields = {f: c for f, c in mapping.metadata_columns.items() if f in METADATA_KINDS}
    missing = {f: c for f, c in fields.items() if schema.find(c) is None}
    if missing:
        options = " ".join(f"--metadata-column {f}={c}" for f, c in missing.items())
        declarations = ", ".join(f'"{c}": "{SUGGESTED_TYPES[f]}"' for f, c in missing.items())
        noun = "column" if len(missing) == 1 else "columns"
        problems.append(
            f"{where} has no {noun} {', '.join(missing.values())} for {options}; its columns "
            f"are {', '.join(column.name for column in schema)}. Fix: create the table with "
            f"those columns too (e.g. {declarations}) or drop those --metadata-column options"
        )
    by_column: dict[str, list[str]] = {}
    for field, column in fields.items():
        found = schema.find(column)
        if found is not None:
            by_column.setdefault(found.name, []).append(field)
    for column_name, sharing in by_column.items():
        if len(sharing) > 1:  # the last one would silently overwrite the others
            problems.append(
                f"{where}: metadata fields {', '.join(sharing)} all go to column "
                f"{column_name}. Fix: give each its own column"
            )
    for field, column in fields.items():
        found = schema.find(column)
        if found is not None and found.type.kind not in METADATA_KINDS[field]:
            kinds = ", ".join(sorted(kind.value for kind in METADATA_KINDS[field]))
            problems.append(
                f"{where}: column {found.name} ({found.type.declared}) cannot hold the Kafka "
                f"{field}. Fix: store it in a column of type {kinds} "
                f"(e.g. {SUGGESTED_TYPES[field]})"
            )
    return problems


def check_tables(client: StreamingIngestClient, mappings: Iterable[TopicMapping]) -> None:
    """Check every mapping against the columns the service reports for its table.

    Raises:
        ConfigurationError: a table is missing or a mapping does not fit it; the message
            lists every problem found, each with its fix.
        BridgeError: the service could not be asked (unreachable, refused the token).
    """
    problems: list[str] = []
    for mapping in mappings:
        try:
            split_table_name(mapping.table)
        except SchemaError as exc:
            problems.append(f"topic {mapping.topic}: {exc}. Fix: --table DATABASE.SCHEMA.TABLE")
            continue
        try:
            columns = client.describe_table(mapping.table)["columns"]
        except TableNotFoundError:
            problems.append(
                f"table {mapping.table} (topic {mapping.topic}) does not exist. Fix: create it "
                "first (see examples/kafka_bridge/README.md) or correct the table name"
            )
            continue
        except IngestError as exc:
            raise BridgeError(
                f"cannot check table {mapping.table} with the channel service: {exc}"
            ) from exc
        problems.extend(mapping_problems(mapping, TableSchema.parse(columns)))
    if problems:
        raise ConfigurationError(
            "the bridge does not start, its mapping does not fit the tables: " + "; ".join(problems)
        )
