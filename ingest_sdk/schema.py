"""Table schemas built from column declarations, and identifier matching.

Names follow the seed system's identifier rules: an unquoted name is stored
upper-case and matched case-insensitively (``id`` finds ``ID``); a name in
double quotes is exact (``'"id"'`` finds only ``id``, ``""`` escapes a quote).
The same rule applies to column declarations and to the keys of inserted rows.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa

from ingest_sdk.column_types import DECLARED_TYPE_KEY, ColumnType, split_declared_type
from ingest_sdk.errors import SchemaError, UnsupportedFeatureError, describe_value

__all__ = [
    "MAX_NAME_LENGTH",
    "Column",
    "TableSchema",
    "check_object_name",
    "normalize_identifier",
    "quote_identifier",
    "spark_fold",
    "split_table_name",
]

#: Longest identifier (database, schema, table or channel name part), in characters.
MAX_NAME_LENGTH = 255
#: Unicode categories no name may hold: controls (NUL, CR, LF...), invisible format marks
#: (right-to-left and zero-width marks, which make two names look alike), lone surrogates,
#: private-use and unassigned code points.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def normalize_identifier(name: str) -> str:
    """The stored form of an identifier: unquoted -> upper case, quoted -> exact.

    Raises:
        SchemaError: the name is empty or not a string.
    """
    if not isinstance(name, str) or not name.strip():
        raise SchemaError(f"a column name must be a non-empty string, got {name!r}")
    if len(name) >= 2 and name[0] == '"' and name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name.strip().upper()


def spark_fold(name: str) -> str:
    """The key under which Spark (case-insensitive, Java's ``equalsIgnoreCase``) takes two
    names for one: character by character, upper then lower case, one character to one
    (Python's ``'İ'.lower()`` is two characters, Java's is ``i``)."""
    out = []
    for char in name:
        upper = char.upper() if len(char.upper()) == 1 else char
        lower = upper.lower()
        out.append(lower if len(lower) == 1 else _SIMPLE_LOWER.get(upper, upper))
    return "".join(out)


#: Java's lower case of the characters whose Python lower case is several characters.
_SIMPLE_LOWER = {"\u0130": "i"}


def check_object_name(name: str, what: str = "a name", max_length: int = MAX_NAME_LENGTH) -> str:
    """Refuse what cannot name a database, schema, table or channel; return it unchanged.

    Any printable character is allowed (spaces, ``/``, quotes, emoji...): names never
    become file paths (table folders are assigned by the catalog). Refused: empty or blank
    names, names made only of dots, more than ``max_length`` characters, and
    control, format (bidi, zero-width), surrogate, private-use or unassigned characters.

    Raises:
        SchemaError: the name is refused; the message says why.
    """
    if not name.strip():
        raise SchemaError(f"{what} must not be empty or blank")
    if len(name) > max_length:
        raise SchemaError(f"{what} is {len(name)} characters long; the limit is {max_length}")
    if not name.strip("."):
        raise SchemaError(f"{what} must not consist only of dots, got {name!r}")
    for char in name:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            raise SchemaError(
                f"{what} must not contain control or invisible characters such as "
                f"U+{ord(char):04X}; got {name[:60]!r}"
            )
    return name


_NAME_PART_RE = re.compile(r'\s*("(?:[^"]|"")*"|[^."]+)\s*')


def split_table_name(name: str) -> tuple[str, str, str]:
    """``"db.schema.table"`` -> stored parts by identifier rules (quoted parts may hold dots).

    Raises:
        SchemaError: not three dot-separated identifiers.
    """
    parts: list[str] = []
    position = 0
    text = name if isinstance(name, str) else ""
    while position <= len(text):
        match = _NAME_PART_RE.match(text, position)
        if match is None:
            break
        parts.append(normalize_identifier(match.group(1)))
        position = match.end()
        if position == len(text):
            break
        if text[position] != ".":
            parts = []
            break
        position += 1
    if len(parts) != 3 or position != len(text):
        shown = name[:300] if isinstance(name, str) else name
        raise SchemaError(
            f"a table name must be DATABASE.SCHEMA.TABLE (quote parts with dots), got {shown!r}"
        )
    for part, what in zip(parts, ("the database name", "the schema name", "the table name"),
                          strict=True):  # fmt: skip
        check_object_name(part, what)
    check_not_reserved(parts[1])
    return parts[0], parts[1], parts[2]


#: The schema whose views describe each database (read-only; nothing may be made in it).
RESERVED_SCHEMA = "INFORMATION_SCHEMA"


def check_not_reserved(schema: str) -> None:
    """Refuse the schema :data:`RESERVED_SCHEMA` for an object of one's own.

    Raises:
        SchemaError: naming the reserved schema and what to do instead.
    """
    if schema == RESERVED_SCHEMA:
        raise SchemaError(f"the schema {RESERVED_SCHEMA} is reserved: each database's "
                          f"{RESERVED_SCHEMA} holds read-only views that describe it; put "
                          "tables, views and streams in another schema")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its stored name, declared type and nullability."""

    name: str
    type: ColumnType
    nullable: bool = True

    @property
    def declaration(self) -> str:
        """The declaration that recreates this column, e.g. ``NUMBER(38,0) NOT NULL``."""
        return self.type.declared + ("" if self.nullable else " NOT NULL")

    def arrow_field(self) -> pa.Field:
        return self.type.arrow_field(self.name, self.nullable)


_NOT_NULL_RE = re.compile(r"NOT\s+NULL\b", re.I)
_NULL_RE = re.compile(r"NULL\b", re.I)
_DEFAULT_RE = re.compile(r"DEFAULT\s+(NULL\b|'(?:[^']|'')*'|\S+)", re.I)
_UNSUPPORTED_CLAUSES = (
    (
        re.compile(
            r"(AUTOINCREMENT|AUTO_INCREMENT|IDENTITY)\b(\s*\([^)]*\))?(\s+START\s+\S+)?"
            r"(\s+INCREMENT\s+\S+)?(\s+(NO)?ORDER\b)?",
            re.I,
        ),
        "AUTOINCREMENT/IDENTITY columns are not supported by streaming ingest; "
        "generate the value in the producer",
    ),
    (
        re.compile(r"COLLATE\s+'[^']*'", re.I),
        "collations are not supported by streaming ingest; declare the column without COLLATE",
    ),
)


def _parse_declaration(name: str, declaration: str) -> Column:
    try:
        column_type, rest = split_declared_type(declaration)
    except UnsupportedFeatureError as exc:
        raise UnsupportedFeatureError(f'column "{name}": {exc}') from exc
    except SchemaError as exc:
        raise SchemaError(f'column "{name}": {exc}') from exc
    nullable = True
    while rest:
        if match := _NOT_NULL_RE.match(rest):
            nullable = False
        elif match := _NULL_RE.match(rest):
            nullable = True
        elif match := _DEFAULT_RE.match(rest):
            if match.group(1).upper() != "NULL":
                raise UnsupportedFeatureError(
                    f'column "{name}": DEFAULT {match.group(1)} is not supported by streaming '
                    "ingest (only DEFAULT NULL); send the value from the producer"
                )
        else:
            for pattern, reason in _UNSUPPORTED_CLAUSES:
                if pattern.match(rest):
                    raise UnsupportedFeatureError(f'column "{name}": {reason}')
            raise SchemaError(
                f'column "{name}": cannot understand {describe_value(rest)} in '
                f"{describe_value(declaration)}; allowed after the type: NOT NULL, NULL, "
                "DEFAULT NULL"
            )
        rest = rest[match.end() :].strip()
    return Column(name, column_type, nullable)


class TableSchema:
    """The ordered columns of a table, with name lookup by identifier rules."""

    __slots__ = ("_arrow", "_by_name", "columns")

    def __init__(self, columns: list[Column] | tuple[Column, ...]) -> None:
        if not columns:
            raise SchemaError("a table needs at least one column")
        self.columns: tuple[Column, ...] = tuple(columns)
        self._by_name: dict[str, Column] = {}
        for column in self.columns:
            if column.name in self._by_name:
                raise SchemaError(f'column "{column.name}" is declared twice')
            self._by_name[column.name] = column
        self._arrow = pa.schema([column.arrow_field() for column in self.columns])

    @classmethod
    def parse(cls, declarations: Mapping[str, str]) -> TableSchema:
        """Build a schema from ``{"ID": "NUMBER(38,0) NOT NULL", "NAME": "VARCHAR(10)"}``.

        Raises:
            SchemaError: a name or declaration is invalid.
            UnsupportedFeatureError: a column uses a feature streaming ingest refuses
                (GEOGRAPHY/GEOMETRY, AUTOINCREMENT/IDENTITY, non-null DEFAULT, COLLATE).
        """
        if not isinstance(declarations, Mapping):
            raise SchemaError(
                "columns must be a mapping of name to declaration, "
                f"e.g. {{'ID': 'NUMBER(38,0) NOT NULL'}}, got {type(declarations).__name__}"
            )
        return cls(
            [
                _parse_declaration(normalize_identifier(name), declaration)
                for name, declaration in declarations.items()
            ]
        )

    @classmethod
    def from_arrow(cls, schema: pa.Schema) -> TableSchema:
        """Rebuild a schema from Arrow fields that carry :data:`DECLARED_TYPE_KEY` metadata.

        This is how a table's declared types come back from its Delta schema.
        """
        columns = []
        for field in schema:
            metadata = field.metadata or {}
            declared = metadata.get(DECLARED_TYPE_KEY.encode())
            if declared is None:
                raise SchemaError(
                    f'column "{field.name}" has no declared type in its metadata '
                    f"({DECLARED_TYPE_KEY}); the table was not created by this system"
                )
            columns.append(Column(field.name, ColumnType.parse(declared.decode()), field.nullable))
        return cls(columns)

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema of converted batches; also the Delta table schema."""
        return self._arrow

    @property
    def names(self) -> list[str]:
        """The column names, in order."""
        return [column.name for column in self.columns]

    def declarations(self) -> dict[str, str]:
        """The declarations that recreate this schema with :meth:`parse`."""
        return {quote_identifier(c.name): c.declaration for c in self.columns}

    def find(self, key: str) -> Column | None:
        """The column a row key names, by identifier rules, or ``None``."""
        try:
            return self._by_name.get(normalize_identifier(key))
        except SchemaError:
            return None

    def __getitem__(self, name: str) -> Column:
        column = self.find(name)
        if column is None:
            raise KeyError(name)
        return column

    def __iter__(self) -> Iterator[Column]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableSchema) and self.columns == other.columns

    def __hash__(self) -> int:
        return hash(self.columns)

    def __repr__(self) -> str:
        return f"TableSchema({self.declarations()!r})"


def quote_identifier(name: str) -> str:
    """The spelling that names exactly ``name`` (a stored identifier) by identifier rules:
    as it is when unquoted would give it back, else in double quotes."""
    if re.fullmatch(r"[A-Z_][A-Z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'
