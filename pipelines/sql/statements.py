"""Statement headers: what kind of statement a text is, and the parts of its header.

Only headers are parsed here (CREATE STREAM ..., SHOW ..., BEGIN): a statement that
holds a query (SELECT, INSERT, UPDATE, DELETE, MERGE) is parsed by sqlglot's Spark
dialect so its table references can be resolved, and Spark evaluates the query.
Snowflake writes ``METADATA$ACTION`` unquoted, which Spark SQL does not accept: those
names are backquoted first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ingest_sdk.schema import RESERVED_SCHEMA
from pipelines.errors import SqlError, UnsupportedStatementError

__all__ = [
    "DEFAULT_DATABASE", "DEFAULT_SCHEMA", "LITERALS", "MAX_CASE_BRANCHES", "MAX_CONDITIONS",
    "MAX_LIST_ITEMS", "MAX_NESTING", "NAME", "OPTION", "Statement",
    "check_nesting", "classify", "qualified", "spark_sql_text", "split_name",
]  # fmt: skip

_PART = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
#: One to three dot-separated identifier parts, quoted or not.
NAME = rf"{_PART}(?:\s*\.\s*{_PART}){{0,2}}"
_TRUE_FALSE = r"(?:TRUE|FALSE|FINAL)"
# A setting's key and value hold no "=", "," or space, and settings are separated by a comma
# or spaces: every character has one place to go, so a pathological header cannot make the
# pattern backtrack (``SET A=A=,A=,...`` took seconds when a value could swallow "=").
_SETTING = r"[^=,\s]+\s*=\s*[^=,\s]+"
_SEPARATOR = r"(?:\s*,\s*|\s+)"
_POINT = (
    r"(?P<at_kind>AT|BEFORE)\s*\(\s*(?P<point_kind>VERSION|TIMESTAMP|STREAM|OFFSET)\s*=>\s*"
    # Words separated by spaces: a space run is always followed by a word or the ")",
    # so no text can be split two ways (``[^)]+?\s*`` was cubic on long runs of spaces).
    r"(?P<point>'(?:[^']|'')*'|[^)\s]+(?:\s+[^)\s]+)*)\s*\)"
)

#: One ``KEY = value`` option of a CREATE DYNAMIC TABLE header: a quoted string or a word.
_OPTION = r"[A-Za-z_]+\s*=\s*(?:'(?:[^']|'')*'|[A-Za-z_][A-Za-z0-9_$]*)"
#: What separates a header's words: spaces, or none after a closing quote (a lexer ends a
#: string or a quoted name at its quote, so ``TARGET_LAG='1 minute'AS SELECT 1`` and
#: ``"D"TARGET_LAG = ...`` read as in Snowflake).
_SPACE_OR_QUOTE = r"(?:\s+|(?<=['\"]))"
_LIKE = r"(?:\s+LIKE\s+(?P<like>'(?:[^']|'')*'))?"
#: SHOW's scope: ``IN ACCOUNT | IN DATABASE [db] | IN [SCHEMA] [[db.]schema]``.
_IN = (r"(?:\s+IN\s+(?:ACCOUNT|(?P<scope>DATABASE|SCHEMA)"
       rf"(?:\s+(?P<scope_name>{NAME}))?|(?P<schema_name>{NAME})))?")  # fmt: skip
#: A column list of CREATE TABLE ... AS: definitions whose parentheses nest one level
#: (``NUMBER(10,2)``), unrolled so that every character has one place to go.
_COLUMN_LIST = r"\((?P<columns>[^()]*(?:\([^()]*\)[^()]*)*)\)"

#: What a change stream watches: ALL, or tables, each with an optional column list
#: (``t(a, "b")``, ``t()``: its key columns only).
_WATCHED = (rf"ALL|{NAME}(?:\s*\((?:\s*{_PART}(?:\s*,\s*{_PART})*)?\s*\))?"
            rf"(?:\s*,\s*{NAME}(?:\s*\((?:\s*{_PART}(?:\s*,\s*{_PART})*)?\s*\))?)*")  # fmt: skip

#: Statement kinds by header, first match wins; the pattern must match the whole text.
#: Each character of a header has one place to go in its pattern (a trailing ``.*`` at most
#: gives back once, to a closing ``)``), so a hostile header costs time linear in its length
#: (tests/pipelines/sql/test_day_one_statements.py runs long ones).
_HEADERS: list[tuple[str, str]] = [
    ("begin", r"(?:BEGIN|START)(?:\s+(?:TRANSACTION|WORK))?(?:\s+NAME\s+\S+)?"),
    ("commit", r"COMMIT(?:\s+WORK)?"),
    ("rollback", r"ROLLBACK(?:\s+WORK)?"),
    ("use", rf"USE\s+(?:(?P<what>DATABASE|SCHEMA)\s+)?(?P<name>{NAME})"),
    ("show_tables", rf"SHOW\s+(?:TERSE\s+)?TABLES{_LIKE}{_IN}"),
    ("show_streams", rf"SHOW\s+(?:TERSE\s+)?STREAMS{_LIKE}{_IN}"),
    ("show_databases", rf"SHOW\s+(?:TERSE\s+)?DATABASES{_LIKE}(?:\s+IN\s+ACCOUNT)?"),
    (
        "show_schemas",
        rf"SHOW\s+(?:TERSE\s+)?SCHEMAS{_LIKE}"
        rf"(?:\s+IN\s+(?:(?P<account>ACCOUNT)|DATABASE(?:\s+(?P<database>{NAME}))?))?",
    ),
    ("show_columns", rf"SHOW\s+COLUMNS{_LIKE}\s+IN\s+(?:TABLE\s+)?(?P<name>{NAME})"),
    ("describe_stream", rf"(?:DESCRIBE|DESC)\s+STREAM\s+(?P<name>{NAME})"),
    ("describe_history", rf"(?:DESCRIBE|DESC)\s+HISTORY\s+(?P<name>{NAME})"),
    ("describe_table", rf"(?:DESCRIBE|DESC)\s+(?:TABLE\s+)?(?P<name>{NAME})"),
    (
        "create_stream",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?STREAM\s+(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?"
        rf"(?P<name>{NAME})\s+ON\s+(?P<on>TABLE|VIEW)\s+(?P<table>{NAME})"
        rf"(?:\s+APPEND_ONLY\s*=\s*(?P<append_only>{_TRUE_FALSE}))?"
        rf"(?:\s+SHOW_INITIAL_ROWS\s*=\s*(?P<initial>TRUE|FALSE))?"
        rf"(?:\s+{_POINT})?"
        r"(?:\s+COMMENT\s*=\s*(?P<comment>'(?:[^']|'')*'))?",
    ),
    (
        "create_view",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?VIEW\s+(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?"
        rf"(?P<name>{NAME})(?:\s+COMMENT\s*=\s*(?P<comment>'(?:[^']|'')*'))?"
        r"\s+AS(?=[\s(])\s*(?P<query>\S.*)",
    ),
    (
        "create_dynamic_table",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?DYNAMIC\s+TABLE\s+"
        rf"(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?(?P<name>{NAME})"
        rf"(?P<options>(?:{_SPACE_OR_QUOTE}{_OPTION})*){_SPACE_OR_QUOTE}AS(?=[\s(])\s*"
        r"(?P<query>\S.*)",
    ),
    (
        "alter_dynamic_table",
        rf"ALTER\s+DYNAMIC\s+TABLE\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})\s+"
        r"(?P<action>REFRESH|SUSPEND|RESUME|"
        rf"SET\s+TARGET_LAG\s*=\s*(?P<lag>'(?:[^']|'')*'|[A-Za-z]+))",
    ),
    (
        "drop_dynamic_table",
        rf"DROP\s+DYNAMIC\s+TABLE\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})",
    ),
    ("show_dynamic_tables", rf"SHOW\s+(?:TERSE\s+)?DYNAMIC\s+TABLES{_LIKE}{_IN}"),
    ("describe_dynamic_table", rf"(?:DESCRIBE|DESC)\s+DYNAMIC\s+TABLE\s+(?P<name>{NAME})"),
    (
        "create_change_stream",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?CHANGE\s+STREAM\s+"
        rf"(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?(?P<name>{NAME})"
        rf"(?:\s+FOR\s+(?P<target>{_WATCHED}))?"
        r"(?:\s+OPTIONS\s*\((?P<options>[^()]*)\))?",
    ),
    (
        "alter_change_stream",
        rf"ALTER\s+CHANGE\s+STREAM\s+(?P<name>{NAME})\s+(?:SET\s+FOR\s+"
        rf"(?P<target>{_WATCHED})|(?P<drop_all>DROP\s+FOR\s+ALL)|"
        r"SET\s+OPTIONS\s*\((?P<options>[^()]*)\)|"
        r"SPLIT\s+PARTITION\s+(?P<split>'[0-9a-fA-F]{1,64}')(?:\s+INTO\s+(?P<parts>[0-9]{1,3}))?|"
        r"MERGE\s+PARTITIONS\s+(?P<merge>'[0-9a-fA-F]{1,64}'(?:\s*,\s*'[0-9a-fA-F]{1,64}'){1,15}))",
    ),
    (
        "show_change_stream_partitions",
        rf"SHOW\s+CHANGE\s+STREAM\s+PARTITIONS\s+(?:IN\s+)?(?P<name>{NAME})",
    ),
    (
        "drop_change_stream",
        rf"DROP\s+CHANGE\s+STREAM\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})",
    ),
    ("show_change_streams", rf"SHOW\s+(?:TERSE\s+)?CHANGE\s+STREAMS{_LIKE}{_IN}"),
    ("drop_view", rf"DROP\s+VIEW\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})"),
    ("show_views", rf"SHOW\s+(?:TERSE\s+)?VIEWS{_LIKE}{_IN}"),
    ("describe_view", rf"(?:DESCRIBE|DESC)\s+VIEW\s+(?P<name>{NAME})"),
    ("drop_stream", rf"DROP\s+STREAM\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})"),
    # Before create_table: "CREATE TABLE t (a INT) AS SELECT f(a)" also ends in ")".
    (
        "create_table_as",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?TABLE\s+(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?"
        rf"(?P<name>{NAME})(?:\s*{_COLUMN_LIST}\s*|\s+)AS(?=[\s(])\s*(?P<query>\S.*)",
    ),
    (
        "create_table",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?TABLE\s+(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?"
        rf"(?P<name>{NAME})\s*\((?P<columns>.*)\)",
    ),
    ("drop_table", rf"DROP\s+TABLE\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})"),
    (
        "truncate",
        rf"TRUNCATE\s+(?:TABLE\s+)?(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})",
    ),
    ("rename_table", rf"ALTER\s+TABLE\s+(?P<name>{NAME})\s+RENAME\s+TO\s+(?P<new>{NAME})"),
    (
        "alter_table_set",
        rf"ALTER\s+TABLE\s+(?P<name>{NAME})\s+SET\s+(?P<settings>{_SETTING}(?:{_SEPARATOR}{_SETTING})*)",
    ),
    (
        "create_database",
        rf"CREATE\s+(?P<replace>OR\s+REPLACE\s+)?(?P<what>DATABASE|SCHEMA)\s+"
        rf"(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?(?P<name>{NAME})",
    ),
    (
        "drop_database",
        rf"DROP\s+(?P<what>DATABASE|SCHEMA)\s+(?P<if_exists>IF\s+EXISTS\s+)?(?P<name>{NAME})"
        r"(?:\s+(?P<mode>CASCADE|RESTRICT))?",
    ),
    ("show_pending_commits", r"SHOW\s+PENDING\s+COMMITS"),
    ("abandon_commit", r"ABANDON\s+COMMIT\s+(?P<id>[0-9]{1,18})"),
    ("explain", r"EXPLAIN(?:\s+(?P<mode>EXTENDED|FORMATTED|COST))?\s+(?P<query>\S.*)"),
]
_COMPILED = [(kind, re.compile(rf"\s*{p}\s*;?\s*", re.I | re.S)) for kind, p in _HEADERS]
#: Statements whose body is a query: parsed by sqlglot, evaluated by Spark.
_QUERY_KINDS = {
    "SELECT": "query",
    "WITH": "query",
    "VALUES": "query",
    "FROM": "query",
    "TABLE": "query",
    "(": "query",
    "INSERT": "insert",
    "UPDATE": "update",
    "DELETE": "delete",
    "MERGE": "merge",
}
SUPPORTED = (
    "SELECT/WITH queries, INSERT, UPDATE, DELETE, MERGE, TRUNCATE TABLE, CREATE [OR "
    "REPLACE] TABLE, CREATE TABLE ... AS SELECT, DROP TABLE, ALTER TABLE ... SET "
    "CHANGE_TRACKING|DATA_RETENTION_TIME_IN_DAYS|MAX_DATA_EXTENSION_TIME_IN_DAYS = ..., ALTER "
    "TABLE ... RENAME TO, SHOW TABLES, SHOW COLUMNS IN, DESCRIBE TABLE, DESCRIBE HISTORY, "
    "CREATE [OR REPLACE] STREAM, DROP STREAM, SHOW STREAMS, DESCRIBE STREAM, CREATE [OR "
    "REPLACE] VIEW, DROP VIEW, SHOW VIEWS, DESCRIBE VIEW, CREATE [OR REPLACE] DYNAMIC TABLE, "
    "ALTER DYNAMIC TABLE ... REFRESH|SUSPEND|RESUME|SET TARGET_LAG, DROP DYNAMIC TABLE, SHOW "
    "DYNAMIC TABLES, DESCRIBE DYNAMIC TABLE, CREATE [OR REPLACE] CHANGE STREAM, ALTER "
    "CHANGE STREAM ... SET FOR|DROP FOR ALL|SET OPTIONS|SPLIT PARTITION|MERGE PARTITIONS, "
    "DROP CHANGE STREAM, SHOW CHANGE STREAMS, SHOW CHANGE STREAM PARTITIONS, SELECT ... FROM "
    "READ_<change stream>(...), CREATE|DROP "
    "DATABASE|SCHEMA, SHOW DATABASES|SCHEMAS, USE DATABASE|SCHEMA, EXPLAIN, BEGIN, COMMIT, "
    "ROLLBACK, SHOW PENDING COMMITS, ABANDON COMMIT <id>"
)
#: Snowflake names with ``$`` that Spark SQL (and sqlglot) read only backquoted: the
#: metadata columns of streams and the function the binder answers before Spark runs.
_METADATA = re.compile(
    r"(?<![\w$`])(METADATA\$(?:ACTION|ISUPDATE|ROW_ID)|SYSTEM\$STREAM_HAS_DATA)(?![\w$])", re.I
)
#: String literals (Spark's raw ``r'...'`` too: a backslash in it is a character, and
#: ``''`` after it starts another literal, as Spark reads it), quoted names and comments.
#: An unterminated one runs to the end of the text, so no start is scanned twice
#: (``/*/*/*...`` would otherwise cost quadratic time).
LITERALS = re.compile(
    r"(?<![\w$])[rR]'[^']*(?:'|\Z)|'(?:[^'\\]|\\.|'')*(?:'|\Z)|`[^`]*(?:`|\Z)|\"(?:[^\"]|\"\")*(?:\"|\Z)|--[^\n]*|/\*.*?(?:\*/|\Z)",
    re.S,
)
#: Parentheses, brackets and CASE may nest this deep: deeper statements are refused before
#: any parser sees them (each parser recurses once per level).
MAX_NESTING = 32
#: How large one statement may be, counted in its text outside literals and comments, and
#: refused before any parser sees it: Spark's analysis, optimisation and generated code
#: grow with these (a CASE of 5,000 branches ran the JVM out of memory; a 20,000-term OR
#: took three minutes, or failed inside Spark).
MAX_CASE_BRANCHES = 1_000  # WHEN
MAX_CONDITIONS = 10_000  # AND, OR
MAX_LIST_ITEMS = 100_000  # commas: IN lists, VALUES, select lists, arguments
#: ``decode(x, s1, r1, s2, r2, ...)`` is a CASE of one branch per pair: its commas count
#: toward MAX_CASE_BRANCHES too.
_COUNTED = re.compile(r"\bdecode\s*\(|[()\[\]{},]|\b(?:CASE|END|WHEN|AND|OR)\b", re.I)
#: A chain of prefix operators (``NOT NOT ...``, ``- - ...``) nests as deep as it is long.
_PREFIX_RUN = re.compile(rf"(?:(?:\bNOT\b|[-+~!])\s*){{{MAX_NESTING + 1}}}", re.I)


@dataclass
class _Shape:
    """What :func:`check_nesting` counts in a statement."""

    deepest: int = 0
    prefixes: bool = False
    branches: int = 0
    conditions: int = 0
    items: int = 0


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement: its kind, the parts of its header, and its text."""

    kind: str
    text: str
    parts: dict[str, str | None] = field(default_factory=dict)


def spark_sql_text(text: str) -> str:
    """Spark SQL text of a statement written for the reference system.

    - Unquoted ``METADATA$...`` and ``SYSTEM$STREAM_HAS_DATA`` names are backquoted (Spark
      does not accept ``$`` there).
    - ``"quoted"`` identifiers (``""`` inside is a quote) are backquoted: Spark would read
      double quotes as a string.
    - ``''`` inside a string literal is one quote, as in Snowflake, PostgreSQL and standard
      SQL: Spark would read ``'O''Brien'`` as the two literals ``'O'`` and ``'Brien'`` and
      concatenate them (``OBrien``), silently changing the data. It becomes ``\\'``.
    """
    out: list[str] = []
    position = 0

    def quoted(match: re.Match[str]) -> str:
        return f"`{match.group(1).upper()}`"

    for literal in LITERALS.finditer(text):
        out.append(_METADATA.sub(quoted, text[position : literal.start()]))
        token = literal.group(0)
        closed = len(token) > 1 and token[-1] == token[0]
        if token.startswith('"') and closed:
            token = "`" + token[1:-1].replace('""', '"').replace("`", "``") + "`"
        elif token.startswith("'") and closed:
            token = "'" + _DOUBLED_QUOTE.sub(_one_quote, token[1:-1]) + "'"
        out.append(token)
        position = literal.end()
    out.append(_METADATA.sub(quoted, text[position:]))
    return "".join(out)


#: Inside a literal: a backslash escape (kept as it is) or a doubled quote (made ``\\'``).
_DOUBLED_QUOTE = re.compile(r"\\.|''", re.S)


def _one_quote(match: re.Match[str]) -> str:
    return "\\'" if match.group(0) == "''" else match.group(0)


def check_nesting(text: str) -> None:
    """Refuse a statement nested deeper than :data:`MAX_NESTING` (parentheses, brackets,
    CASE ... END), or larger than :data:`MAX_CASE_BRANCHES`, :data:`MAX_CONDITIONS` or
    :data:`MAX_LIST_ITEMS`, in one pass over the text outside literals and comments.

    Raises:
        SqlError: STATEMENT_TOO_COMPLEX, naming the limit and what to write instead.
    """
    shape = _shape(text)
    if shape.deepest > MAX_NESTING:
        raise SqlError(
            f"the statement nests parentheses, brackets or CASE {shape.deepest} levels deep; at "
            f"most {MAX_NESTING} are allowed: flatten it (a WITH clause names a subquery once)",
            "STATEMENT_TOO_COMPLEX",
        )
    if shape.prefixes:
        raise SqlError(
            f"the statement chains more than {MAX_NESTING} prefix operators (NOT, -, +, ~, !) "
            "in a row, the most allowed: write the chain shorter (two NOTs cancel)",
            "STATEMENT_TOO_COMPLEX",
        )
    for count, limit, what, instead in (
        (shape.branches, MAX_CASE_BRANCHES, "CASE branches (WHEN, or pairs of decode)",
         "put the mapping in a table, or a VALUES list, and join it"),
        (shape.conditions, MAX_CONDITIONS, "AND/OR operators",
         "write alternatives of one column as column IN (...), or join a table of them"),
        (shape.items, MAX_LIST_ITEMS, "commas (between the items of IN lists, VALUES, "
         "select lists, arguments)", "put the values in a table and join it, or split the "
         "statement"),
    ):  # fmt: skip
        if count > limit:
            raise SqlError(f"the statement has {count:,} {what}; at most {limit:,} are "
                           f"allowed in one statement: {instead}",
                           "STATEMENT_TOO_COMPLEX")  # fmt: skip


def _shape(text: str) -> _Shape:
    """How deep the text nests and how many branches, conditions and items it holds."""
    # Brackets and CASE ... END are counted apart: a stray END (a column named END)
    # must not cancel an open parenthesis.
    shape, brackets, cases, position = _Shape(), 0, 0, 0
    decodes: list[int] = []  # the bracket depths at which a decode( is open
    paired = 0  # commas between decode's arguments
    for literal in [*LITERALS.finditer(text), None]:
        stop = literal.start() if literal is not None else len(text)
        for counted in _COUNTED.finditer(text, position, stop):
            token = counted.group(0).upper()
            if token.startswith("DECODE"):
                brackets += 1
                decodes.append(brackets)
            elif token == "," and decodes and decodes[-1] == brackets:
                shape.items += 1
                paired += 1  # two arguments more: one branch more
            elif token in ")]}" and decodes and decodes[-1] == brackets:
                decodes.pop()
                brackets -= 1
            elif token == "CASE":
                cases += 1
            elif token == "END":
                cases = max(0, cases - 1)
            elif token == "WHEN":
                shape.branches += 1
            elif token in ("AND", "OR"):
                shape.conditions += 1
            elif token == ",":
                shape.items += 1
            else:
                brackets += 1 if token in "([{" else -1
            shape.deepest = max(shape.deepest, brackets + cases)
        shape.prefixes = shape.prefixes or _PREFIX_RUN.search(text, position, stop) is not None
        if literal is not None:
            _check_comment(literal.group(0))
            position = literal.end()
    shape.branches += paired // 2
    return shape


def _check_comment(token: str) -> None:
    """Refuse an unterminated ``/*`` comment, and a ``/*`` inside one: Spark nests
    bracketed comments, Snowflake and our readers of the text do not, so a nested one
    would be read two ways (and Spark's lexer spends memory on every level)."""
    if not token.startswith("/*"):
        return
    if len(token) < 4 or not token.endswith("*/"):
        raise SqlError("syntax error: a /* comment is never closed; end it with */",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if "/*" in token[2:]:
        raise SqlError("syntax error: a /* comment holds another /*; comments do not nest: "
                       "close each comment with */ before opening the next",
                       "SQL_COMPILATION_ERROR")  # fmt: skip


def classify(text: str) -> Statement:
    """The kind of one statement.

    Raises:
        SqlError: not a single statement of text, or nested too deep.
        UnsupportedStatementError: a statement this system does not run (the message
            lists the ones it does); one that is nearly a dynamic table statement is a
            SqlError naming the clause instead.
    """
    if not isinstance(text, str) or not text.strip():
        raise SqlError("the statement is empty; send one SQL statement", "SQL_COMPILATION_ERROR")
    check_nesting(text)
    header = blank_comments(text)
    for kind, pattern in _COMPILED:
        match = pattern.fullmatch(header)
        if match is not None:
            parts = match.groupdict()
            if parts.get("query") is not None:  # kept as written, its comments too
                parts["query"] = text[match.start("query") : match.end("query")]
            return Statement(kind, text, parts)
    stripped = LITERALS.sub(" ", text).lstrip().lstrip("(")
    first = re.match(r"[A-Za-z]+", stripped)
    word = "(" if text.lstrip().startswith("(") else (first.group(0) if first else "")
    query_kind = _QUERY_KINDS.get(word.upper())
    if query_kind is not None:
        return Statement(query_kind, text)
    _raise_near_miss(header)
    shown = " ".join(text.split())[:80]
    raise UnsupportedStatementError(f"unsupported statement {shown!r}; supported: {SUPPORTED}")


def blank_comments(text: str) -> str:
    """``text`` with each comment (outside strings and quoted names) made spaces of its
    length: a statement's header reads a comment as a space, wherever it stands, and
    every position in it is the text's."""
    return LITERALS.sub(
        lambda m: " " * len(m.group(0)) if m.group(0)[:2] in ("--", "/*") else m.group(0), text
    )


def _raise_near_miss(text: str) -> None:
    """Raise the error of a statement that is nearly one of ours (a dynamic table's with a
    clause that cannot be read), naming the clause, instead of the list of statements."""
    from pipelines.sql.near_misses import near_miss  # it reads this module's patterns

    error = near_miss(text)
    if error is not None:
        raise error


def split_name(name: str) -> list[str]:
    """The parts of a dotted name by identifier rules: unquoted parts upper-cased,
    quoted parts exact (``""`` is a quote)."""
    parts = re.findall(_PART, name)
    return [p[1:-1].replace('""', '"') if p.startswith('"') else p.upper() for p in parts]


DEFAULT_DATABASE, DEFAULT_SCHEMA = "DB", "PUBLIC"
#: The schema of every database whose views describe it (reserved: nothing is made in it).
INFORMATION_SCHEMA = RESERVED_SCHEMA


def qualified(
    parts: list[str], database: str = DEFAULT_DATABASE, schema: str = DEFAULT_SCHEMA
) -> tuple[str, str, str]:
    """``DB.SCHEMA.NAME`` of a name's one to three parts, missing ones from the defaults."""
    full = [database, schema][: 3 - len(parts)] + parts
    return full[0], full[1], full[2]


#: One option of a header's option list (``KEY = value``), for reading them one by one.
OPTION = re.compile(r"([A-Za-z_]+)\s*=\s*('(?:[^']|'')*'|[A-Za-z_][A-Za-z0-9_$]*|[0-9]+)")
