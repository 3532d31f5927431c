"""The SQL boundary: a statement reaches the warehouse's own objects and nothing else.

Statements come from anyone holding a token, so every query text our layer hands to
Spark passes this guard first, and the guard decides on Spark's own plans, never on the
text:

1. Spark parses the text. The parsed plan is refused before analysis if it names a
   relation by more than one part (``parquet.`/path```, ``other_catalog.x.y``), builds a
   name at run time (``IDENTIFIER(...)``), calls a function that is not an allowed
   built-in (reflection, file-reading and user functions) or is a command (``SET``,
   ``CACHE``, ``ADD JAR``, ``INSERT OVERWRITE DIRECTORY`` ...). Analysis could touch
   files for some of these, so they never reach it.
2. Spark analyses the plan without running any command.
3. Every node and expression of the analyzed plan must be of a class on the allowlist
   (:mod:`pipelines.plan_classes`, drawn up from Spark's built-in functions and a corpus
   of queries, less :data:`DENIED_FUNCTIONS`). Leaf relations are allowed only as the
   temporary views our binder made for this statement (table snapshots, change sets),
   whose contents are not walked: they are ours. Anything else, including a class the
   list does not know, is refused (fail closed).

The service's Spark also runs with Spark's own walls (``spark.sql.runSQLOnFiles=false``,
``spark.sql.restrictedMode.enabled``, an empty ``spark.sql.reflect.allowList``; see
:func:`flush.spark_tables.spark_session`), which stop the same things a second time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from pipelines.errors import SqlError, spark_errors
from pipelines.plan_classes import ALLOWED_CLASSES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DENIED_FUNCTIONS", "DENIED_TABLE_FUNCTIONS", "RefusedStatementError", "guarded_frame"]

_REFLECTION = "calls any Java method of the service's JVM"
_FILES = "reveals the warehouse's file paths"
#: Built-in functions refused, and why (every other built-in SQL function is allowed).
DENIED_FUNCTIONS: dict[str, str] = {
    "reflect": _REFLECTION,
    "java_method": _REFLECTION,
    "try_reflect": _REFLECTION,
    "input_file_name": _FILES,
    "input_file_block_start": _FILES,
    "input_file_block_length": _FILES,
    "current_user": "reveals the service's operating-system account",
    "user": "reveals the service's operating-system account",
    "session_user": "reveals the service's operating-system account",
    "from_avro": "can read a schema from a file or URL (option avroSchemaUrl)",
    "to_avro": "can read a schema from a file or URL",
    "schema_of_avro": "can read a schema from a file or URL",
    "from_protobuf": "reads a descriptor file named by the statement",
    "to_protobuf": "reads a descriptor file named by the statement",
    "from_xml": "parses XML, whose entities can name local files",
    "schema_of_xml": "parses XML, whose entities can name local files",
    **dict.fromkeys(
        ("xpath", "xpath_boolean", "xpath_double", "xpath_float", "xpath_int", "xpath_long",
         "xpath_number", "xpath_short", "xpath_string"),
        "parses XML, whose entities can name local files",
    ),
}
#: Table-valued functions refused (``range``, ``explode`` and the like are allowed).
DENIED_TABLE_FUNCTIONS: dict[str, str] = {
    "python_worker_logs": "reveals the logs of the service's Python workers",
}

#: Plan and expression classes that mean a construct users know by another name.
_CONSTRUCTS = {
    "ScriptTransformation": "TRANSFORM ... USING (a script run as a process)",
    "CallMethodViaReflection": "reflect / java_method (calls into the JVM)",
    "TryReflect": "try_reflect (calls into the JVM)",
    "LogicalRelation": "a file or folder read by path",
    "DataSourceV2Relation": "a table of a Spark catalog or a file read by path",
    "HiveTableRelation": "a table of a Spark catalog",
    "LogicalRDD": "a Spark data frame that is not one of this statement's tables",
    "InMemoryRelation": "a cached Spark table",
    "View": "a Spark view that is not one of the warehouse's objects",
    "ScalaUDF": "a user-defined function",
    "PythonUDF": "a user-defined function",
    "ScalaUDAF": "a user-defined function",
    "InsertIntoDir": "INSERT OVERWRITE DIRECTORY",
}
_PARSE_ROOTS_REFUSED = ("Command", "Statement", "InsertIntoDir", "CacheTable", "UncacheTable")


class RefusedStatementError(SqlError):
    """The statement reaches beyond the warehouse's objects (files, the JVM, the process,
    Spark's own catalog or settings); it was refused before it ran."""

    code = "STATEMENT_NOT_ALLOWED"


def guarded_frame(spark: SparkSession, text: str, views: Collection[str]) -> DataFrame:
    """The DataFrame of a query text, after checking its plans.

    Args:
        spark: the Spark session.
        text: Spark SQL text whose tables our binder replaced by temporary views.
        views: the names of those views: the only relations the query may read.

    Raises:
        RefusedStatementError: the query names something outside the warehouse, calls a
            refused function, or holds a plan node the guard does not know.
        SqlError: Spark cannot parse or analyse it (``SQL_COMPILATION_ERROR``).
    """
    from pyspark.sql import DataFrame

    allowed = {view.lower() for view in views}
    jspark = spark._jsparkSession  # type: ignore[attr-defined]
    state = jspark.sessionState()
    with spark_errors("SQL_COMPILATION_ERROR"):
        parsed = state.sqlParser().parsePlan(text)
        check_parsed(orjson.loads(parsed.toJSON()))
        mode = spark._jvm.org.apache.spark.sql.execution.CommandExecutionMode.SKIP()  # type: ignore[union-attr]
        execution = state.executePlan(parsed, mode)
        execution.assertAnalyzed()
        analyzed = execution.analyzed()
        check_analyzed(orjson.loads(analyzed.toJSON()), allowed)
        datasets = spark._jvm.org.apache.spark.sql.classic.Dataset  # type: ignore[union-attr]
        return DataFrame(datasets.ofRows(jspark, analyzed), spark)


def check_parsed(plan: list[Any]) -> None:
    """Refuse a parsed plan that names files, builds names, calls refused functions or is a
    command (before analysis, which could touch files for some of them)."""
    root = _short(plan[0]["class"]) if plan else ""
    if root.endswith(_PARSE_ROOTS_REFUSED) or root in _CONSTRUCTS:
        raise RefusedStatementError(
            f"{_CONSTRUCTS.get(root, 'this statement')} cannot run here: statements may only "
            "query and change the warehouse's tables (no Spark commands or settings)"
        )
    for node in _nodes(plan):
        kind = _short(node["class"])
        if kind in ("PlanWithUnresolvedIdentifier", "ExpressionWithUnresolvedIdentifier"):
            raise RefusedStatementError(
                "IDENTIFIER(...) with a computed name is not supported: write the table or "
                "function name itself"
            )
        if kind == "UnresolvedRelation":
            parts = _name_parts(node.get("multipartIdentifier"))
            if len(parts) != 1:
                raise RefusedStatementError(
                    f"{'.'.join(parts)[:120]!r} is not one of the warehouse's objects: files, "
                    "folders and Spark catalogs cannot be read by name; read a table, view or "
                    "stream of the warehouse"
                )
        elif kind == "UnresolvedFunction":
            _check_function(_name_parts(node.get("nameParts")), DENIED_FUNCTIONS, "function")
        elif kind == "UnresolvedTableValuedFunction":
            _check_function(_name_parts(node.get("name")), DENIED_TABLE_FUNCTIONS,
                            "table function")  # fmt: skip
        elif kind in _CONSTRUCTS:
            raise RefusedStatementError(f"{_CONSTRUCTS[kind]} is not allowed here")


def check_analyzed(plan: list[Any], views: Collection[str]) -> None:
    """Refuse an analyzed plan holding a class off the allowlist, or a relation other than
    this statement's own views (``views``, lower-case)."""
    for node in _nodes(plan, views):
        kind = _short(node["class"])
        if node["class"] not in ALLOWED_CLASSES:
            what = _CONSTRUCTS.get(kind)
            if what is None:
                what = f"the construct {kind!r}"
            raise RefusedStatementError(
                f"{what} is not allowed here: statements may read only the warehouse's tables, "
                "views and streams, with built-in SQL functions that reach neither files, the "
                "JVM nor the process (see the security page of the docs for the list)"
            )


def _check_function(parts: list[str], denied: dict[str, str], what: str) -> None:
    name = parts[-1].lower() if parts else ""
    if len(parts) != 1:
        raise RefusedStatementError(
            f"the {what} {'.'.join(parts)[:120]!r} is not a built-in SQL {what}: write the "
            "built-in's name alone (user functions are not supported)"
        )
    reason = denied.get(name)
    if reason is not None:
        raise RefusedStatementError(f"the {what} {name} is not allowed here: it {reason}")


def _nodes(plan: Any, views: Collection[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every plan node and expression in a plan's JSON (Spark's ``toJSON``: each tree a
    pre-order list of nodes, children counted by ``num-children``), plans inside
    expressions (subqueries) included. The subtree of one of ``views`` is not entered."""
    stack: list[Any] = [plan]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(v for k, v in value.items() if k != "class")
            continue
        if not isinstance(value, list):
            continue
        if not (value and isinstance(value[0], dict) and "class" in value[0]):
            stack.extend(value)
            continue
        index = 0
        while index < len(value):
            node = value[index]
            if views is not None and _is_own_view(node, views):
                index = _subtree_end(value, index)
                continue
            yield node
            stack.extend(v for k, v in node.items() if k not in ("class", "num-children"))
            index += 1


def _is_own_view(node: dict[str, Any], views: Collection[str]) -> bool:
    if _short(node.get("class", "")) != "View" or node.get("isTempView") is not True:
        return False
    identifier = (node.get("desc") or {}).get("identifier") or {}
    return not identifier.get("database") and str(identifier.get("table", "")).lower() in views


def _subtree_end(nodes: list[Any], start: int) -> int:
    """The index after the subtree rooted at ``start`` of a pre-order node list."""
    remaining, index = 1, start
    while remaining and index < len(nodes):
        remaining += int(nodes[index].get("num-children", 0)) - 1
        index += 1
    return index


def _name_parts(value: Any) -> list[str]:
    """A name's parts as Spark's JSON writes them (``"[a, b]"``) or as a list."""
    if isinstance(value, list):
        return [str(part) for part in value]
    text = str(value or "")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [part.strip() for part in text.split(", ")] if text else []


def _short(class_name: str) -> str:
    return class_name.rsplit(".", 1)[-1]
