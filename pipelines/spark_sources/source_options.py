"""Options of our Spark data sources, checked at the door.

Spark hands a data source its options as text (keys case-insensitive). Every key is
checked against the ones the source knows (a misspelt ``startingVersion`` must not
silently read from the beginning), the warehouse must be an existing warehouse (a
source never creates a catalog), and the table must exist.

Spark runs a Python data source's constructor, ``schema()``, ``reader()`` and
``writer()`` in a Python worker process, not in the driver that called ``load()`` or
``save()``; what that worker raises reaches the driver as text inside Spark's own
error (``AnalysisException`` with condition ``PYTHON_DATA_SOURCE_ERROR``, or a
``StreamingQueryException``), after Spark's prefix and a traceback of the worker.
No hook of Spark's runs in the driver between the call and that error, so
:func:`source_errors` turns it back into our error where the driver catches it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from catalog import (
    CATALOG_FILE,
    CATALOG_VARIABLE,
    Catalog,
    TableInfo,
    did_you_mean,
    holds_catalog,
    is_postgres,
    open_catalog,
)
from catalog.postgres import CatalogUnavailableError, where
from ingest_sdk.errors import IngestError, InvalidValueError
from ingest_sdk.temporal import moment_micros
from pipelines import errors
from pipelines.errors import InvalidOptionError, ObjectNotFoundError, SqlError
from pipelines.sql.statements import NAME, qualified, split_name

__all__ = ["CATALOG_FILE", "SourceOptions", "is_warehouse", "source_errors"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The last line of a worker's traceback when one of our errors ended it: Python's own
#: ``module.Class: message`` (also what Spark shows with its traceback hidden).
_RAISED = re.compile(r"\bpipelines\.errors\.(?P<kind>[A-Za-z]+Error): (?P<message>[^\n]*)")


def _ours(text: str) -> SqlError | None:
    """Our error that a Spark error's text carries (the first one named), rebuilt."""
    for found in _RAISED.finditer(text):
        kind = getattr(errors, found["kind"], None)
        if isinstance(kind, type) and issubclass(kind, SqlError):
            message = re.sub(r"\s*SQLSTATE: \w+$", "", found["message"]).rstrip()
            return kind(message) if message else None
    return None


@contextlib.contextmanager
def source_errors() -> Iterator[None]:
    """Spark's errors inside the block that carry one of our data sources' errors
    (a bad option, a missing table, a stale version) raised as that error, with our
    message first and no worker traceback; other errors pass unchanged.

        with source_errors():
            spark.read.format("ingest-changes").options(**options).load()

    Wrap the calls that run the source: ``load()``, ``save()``, ``start()`` and
    ``awaitTermination()`` (a streaming sink is planned in the query's thread).
    """
    from pyspark.errors import PySparkException

    try:
        yield
    except PySparkException as exc:
        ours = _ours(str(exc))
        if ours is None:
            raise
        raise ours from None


def is_warehouse(folder: Path) -> bool:
    """Whether ``folder`` holds a warehouse: a catalog database, checked read-only (the
    faces that must not create one, the sources and the command line, ask first)."""
    return holds_catalog(folder / CATALOG_FILE)


class SourceOptions:
    """The options of one data source use, validated.

    Args:
        options: what Spark passed (case-insensitive keys).
        source: the format name, for messages.
        known: the option names this use accepts, in their documented spelling.
    """

    def __init__(self, options: Mapping[str, str], source: str, known: Iterable[str]) -> None:
        self.source = source
        spelled = {name.lower(): name for name in known}
        self.values = {str(key).lower(): str(value) for key, value in options.items()}
        unknown = sorted(set(self.values) - set(spelled))
        if unknown:
            raise InvalidOptionError(
                f"{source}: unknown option(s) {', '.join(unknown)}; the options are "
                f"{', '.join(sorted(spelled.values()))}"
            )
        self._spelled = spelled

    def get(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def require(self, name: str, hint: str) -> str:
        value = self.get(name)
        if value is None or not value.strip():
            raise InvalidOptionError(f"{self.source}: the option {name} is required ({hint})")
        return value.strip()

    def whole_number(self, name: str, minimum: int = 0) -> int | None:
        """An optional whole-number option, at least ``minimum``."""
        value = self.get(name)
        if value is None:
            return None
        text = value.strip()
        if re.fullmatch(r"[0-9]{1,18}", text) is None or int(text) < minimum:
            raise InvalidOptionError(
                f"{self.source}: the option {name} must be a whole number of at least "
                f"{minimum}, got {value[:40]!r}"
            )
        return int(text)

    def timestamp(self, name: str) -> datetime | None:
        """An optional timestamp option (UTC unless it names an offset)."""
        value = self.get(name)
        if value is None:
            return None
        with contextlib.suppress(InvalidValueError, OverflowError):  # not one; before year 1
            micros = moment_micros(value)  # as statements and change stream reads read it
            if micros is not None:
                return _EPOCH + timedelta(microseconds=micros)
        raise InvalidOptionError(
            f"{self.source}: cannot read the option {name}={value[:40]!r} as a timestamp; "
            "write 'YYYY-MM-DD HH:MM:SS' (UTC) or a timestamp with an offset (+01:00)"
        )

    def warehouse(self) -> Path:
        """The warehouse folder: it must exist and, unless the catalog is elsewhere
        (:meth:`catalog_location`), hold the service's catalog (checked read-only:
        opening a catalog creates its tables, which a source must never do)."""
        folder = Path(self.require("warehouse", "the service's warehouse folder"))
        if self._catalog_given() is not None:
            if not folder.is_dir():
                raise InvalidOptionError(
                    f"{self.source}: the warehouse folder {str(folder)[:200]} does not exist; "
                    "set the option warehouse to the folder the service uses"
                )
        elif not is_warehouse(folder):
            why = (
                f"its {CATALOG_FILE} is not a catalog database"
                if (folder / CATALOG_FILE).exists()
                else f"no {CATALOG_FILE}"
            )
            raise InvalidOptionError(
                f"{self.source}: {str(folder)[:200]} is not a warehouse ({why}); set the "
                "option warehouse to the folder the service (make run) or a Session uses, "
                f"and the option catalog (or {CATALOG_VARIABLE}) to its catalog if that is "
                "not the folder's SQLite file"
            )
        return folder

    def _catalog_given(self) -> str | None:
        """The catalog named by the option ``catalog``, else by $INGEST_CATALOG."""
        given = (self.get("catalog") or os.environ.get(CATALOG_VARIABLE) or "").strip()
        return given or None

    def catalog_location(self) -> str:
        """Where the catalog is: the option ``catalog`` (a SQLite file or a PostgreSQL
        URL), else ``$INGEST_CATALOG`` (where the service's Spark worker finds it), else
        the warehouse's SQLite file; a catalog must be laid out there (checked without
        creating one)."""
        given = self._catalog_given()
        if given is None:
            return str(self.warehouse() / CATALOG_FILE)
        named = where(given) if is_postgres(given) else given[:200]
        try:
            held = holds_catalog(given)
        except CatalogUnavailableError as exc:
            raise InvalidOptionError(f"{self.source}: {exc}") from None
        if not held:
            raise InvalidOptionError(
                f"{self.source}: {named} holds no catalog; set the option catalog (or "
                f"{CATALOG_VARIABLE}) to the catalog the service uses (its --catalog)"
            )
        return given

    def catalog(self) -> Catalog:
        return open_catalog(self.catalog_location())

    def table(self, catalog: Catalog) -> TableInfo:
        """The table the option ``table`` names (``T``, ``SCHEMA.T`` or ``DB.SCHEMA.T``;
        unquoted parts upper-cased; defaults DB and PUBLIC)."""
        text = self.require("table", "a table name such as DB.PUBLIC.ORDERS")
        if re.fullmatch(NAME, text) is None:
            raise InvalidOptionError(
                f"{self.source}: invalid table name {text[:80]!r}; write NAME, SCHEMA.NAME or "
                'DB.SCHEMA.NAME (letters, digits, _ and $, or "quoted")'
            )
        database, schema, name = qualified(split_name(text))
        try:
            return catalog.get_table(database, schema, name)
        except IngestError:
            raise ObjectNotFoundError(
                f"{self.source}: table {database}.{schema}.{name} does not exist"
                f"{did_you_mean(catalog, database, schema, name, ['table'])}; check the "
                "option table (unquoted names are upper-cased) and the option warehouse"
            ) from None
