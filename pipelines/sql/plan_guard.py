"""The SQL boundary: a statement reaches the warehouse's own objects and nothing else.

Statements come from anyone holding a token, so every query text our layer hands to
Spark passes this guard first:

1. :func:`check_parsed`, on Spark's own parse of the final text (its unresolved plan,
   before anything is analysed), refuses by name what is refused everywhere:
   ``IDENTIFIER(...)`` (names built at run time), qualified function names, refused
   functions and table functions, and script transforms. Nothing of the text reaches
   Spark's analysis (which reads a file for some functions, e.g. from_protobuf's
   descriptor) before this check, and it reads the text exactly as Spark will. It also
   gives plain messages; the next wall does not depend on it.
2. :func:`guarded_frame` lets Spark analyse the text without running any command, then
   walks the analyzed plan in the JVM: every plan node and expression must
   be of a class on the allowlist (:mod:`pipelines.sql.plan_classes`, drawn up from Spark's
   built-in functions and a corpus of queries, less :data:`DENIED_FUNCTIONS`), and the
   only relations it may read are the temporary views our binder made for this
   statement (table snapshots, change sets), whose contents are not walked: they are
   ours. Anything else, including a class the list does not know, is refused (fail
   closed). The walk visits each node once (Spark's JSON form of a plan repeats a
   subtree held in an option or a tuple, exponentially for nested CASE).

The service's Spark also runs with Spark's own walls (``spark.sql.runSQLOnFiles=false``,
``spark.sql.restrictedMode.enabled``, an empty ``spark.sql.reflect.allowList``; see
:func:`flush.spark_tables.spark_session`), which stop the same things a second time, and
keep analysis from touching files.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from pipelines.errors import SqlError, spark_errors
from pipelines.sql.plan_classes import ALLOWED_CLASSES
from pipelines.sql.type_names import parse_plan_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DENIED_FUNCTIONS", "DENIED_TABLE_FUNCTIONS", "RefusedStatementError", "analyzed_nodes",
    "check_parsed", "guarded_frame", "members", "plan_classes",
]  # fmt: skip

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
    "version": "reveals the service's Spark version and build",
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


class RefusedStatementError(SqlError):
    """The statement reaches beyond the warehouse's objects (files, the JVM, the process,
    Spark's own catalog or settings); it was refused before it ran."""

    code = "STATEMENT_NOT_ALLOWED"


def check_parsed(spark: SparkSession, parsed: Any) -> None:
    """Refuse, on Spark's unresolved plan of a statement, what is refused by name:
    ``IDENTIFIER``, qualified or refused functions and table functions, and script
    transforms.

    Raises:
        RefusedStatementError: naming the construct.
    """
    walk = _walker(spark)._walk(parsed, (), leaves=False, wanted={"UnresolvedFunction"})
    for name, node in walk:
        short = _short(name)
        if short == "ScriptTransformation":
            raise RefusedStatementError(f"{_CONSTRUCTS['ScriptTransformation']} is not allowed")
        if "UnresolvedIdentifier" in short:
            raise RefusedStatementError(
                "IDENTIFIER(...) is not supported: write the table or function name itself"
            )
        if short == "UnresolvedFunction":
            parts = [str(p) for p in _list(node.nameParts())]
            if len(parts) > 1:
                raise RefusedStatementError(
                    f"the function {'.'.join(parts)[:120]!r} is not a built-in SQL function: "
                    "write the built-in's name alone (user functions are not supported)"
                )
            _check_function(parts[0].lower(), DENIED_FUNCTIONS, "function")
        elif short == "UnresolvedTableValuedFunction":
            parts = [str(p) for p in _list(node.name())]
            _check_function(parts[-1].lower(), DENIED_TABLE_FUNCTIONS, "table function")


def guarded_frame(spark: SparkSession, text: str, views: Collection[str]) -> DataFrame:
    """The DataFrame of a query text, after checking its analyzed plan.

    Args:
        spark: the Spark session.
        text: Spark SQL text whose tables our binder replaced by temporary views.
        views: the names of those views: the only relations the query may read.

    Raises:
        RefusedStatementError: the query reads something outside the warehouse, calls a
            refused function, or holds a plan node the guard does not know.
        SqlError: Spark cannot parse or analyse it (``SQL_COMPILATION_ERROR``).
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import DataFrame

    jspark: Any = spark._jsparkSession  # type: ignore[attr-defined]
    jvm: Any = spark._jvm  # type: ignore[attr-defined]
    state = jspark.sessionState()
    try:
        with spark_errors("SQL_COMPILATION_ERROR"):
            walker = _walker(spark)
            parsed, text = parse_plan_text(jspark, text)
            if walker.is_command(parsed):
                raise RefusedStatementError(
                    "this statement cannot run here: statements may only query and change the "
                    "warehouse's tables (no Spark commands or settings)"
                )
            # Before analysis: a few functions read a file while Spark analyses them (a
            # protobuf descriptor, an avro schema).
            check_parsed(spark, parsed)
            execution = state.executePlan(
                parsed, jvm.org.apache.spark.sql.execution.CommandExecutionMode.SKIP()
            )
            try:
                execution.assertAnalyzed()
            except AnalysisException as exc:
                if "RESTRICTED_MODE" in str(exc.getCondition() or ""):  # Spark's own wall
                    raise RefusedStatementError(_restricted(str(exc))) from None
                raise
            analyzed = execution.analyzed()
            check_analyzed(walker.nodes(analyzed, views))
            # The DataFrame of this very analysis (Dataset.ofRows would analyse again).
            encoder = jvm.org.apache.spark.sql.catalyst.encoders.RowEncoder.encoderFor(
                analyzed.schema()
            )
            return DataFrame(jvm.org.apache.spark.sql.classic.Dataset(execution, encoder), spark)
    except RecursionError:
        raise SqlError("the statement is too complex to check; split it or flatten it",
                       "STATEMENT_TOO_COMPLEX") from None  # fmt: skip


def check_analyzed(nodes: Iterator[str]) -> None:
    """Refuse an analyzed plan holding a class off the allowlist (``nodes``: the class
    names of every node a walk meets; the walk itself refuses other views)."""
    for name in nodes:
        if name not in ALLOWED_CLASSES:
            raise RefusedStatementError(
                f"{_construct(name)} is not allowed here: statements may read only the "
                "warehouse's tables, views and streams, with built-in SQL functions that reach "
                "neither files, the JVM nor the process (see the security page of the docs)"
            )


def plan_classes(spark: SparkSession, plan: Any, views: Collection[str]) -> list[str]:
    """The class of every node of a JVM plan, each once, but inside ``views`` (for
    drawing up the allowlist)."""
    return list(_walker(spark).nodes(plan, {v.lower() for v in views}))


def _construct(name: str) -> str:
    short = _short(name)
    what = _CONSTRUCTS.get(short)
    if what is not None:
        return what
    function = _DENIED_CLASSES.get(short)
    if function is not None:
        return f"the function {function} (it {DENIED_FUNCTIONS[function]})"
    return f"the construct {short!r}"


def _restricted(message: str) -> str:
    if "TRANSFORM" in message:
        return f"{_CONSTRUCTS['ScriptTransformation']} is not allowed here"
    for name in ("try_reflect", "java_method", "reflect"):
        if f"`{name}`" in message:
            return f"the function {name} is not allowed here: it {DENIED_FUNCTIONS[name]}"
    return "this statement uses a feature that is not allowed here (calls into the JVM)"


def _check_function(name: str, denied: dict[str, str], what: str) -> None:
    reason = denied.get(name)
    if reason is not None:
        raise RefusedStatementError(f"the {what} {name} is not allowed here: it {reason}")


class _Walker:
    """Walks a JVM plan in few calls into the JVM: an expression and everything under it
    come in one answer (Spark's own traversal, ``TreeNode.map``), the classes of a list of
    nodes in another, and a node is fetched only when more than its class is asked for
    (a list of 100,000 literals costs a few calls, not 300,000). Plan nodes are walked
    one by one, to stop at our views."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = spark._jvm  # type: ignore[attr-defined]
        forname = jvm.java.lang.Class.forName
        self._plan = forname("org.apache.spark.sql.catalyst.plans.QueryPlan")
        self._command = forname("org.apache.spark.sql.catalyst.plans.logical.Command")
        self._subquery = forname("org.apache.spark.sql.catalyst.expressions.PlanExpression")
        self._leaf = forname("org.apache.spark.sql.catalyst.trees.LeafLike")
        #: Per class: a plan node, a subquery expression, a leaf (no children to ask for).
        self._kinds: dict[str, tuple[bool, bool, bool]] = {}
        # Members looked up once: each use is then one call.
        utils = jvm.org.apache.commons.lang3.ClassUtils
        self._class_name, self._classes = utils.getName, utils.toClass
        self._shown = jvm.org.apache.commons.lang3.ArrayUtils.toString
        self._get = jvm.java.lang.reflect.Array.get
        self._any = jvm.scala.reflect.ClassTag.AnyRef()
        self._identity = getattr(jvm.scala.Predef, "$conforms")()

    def is_command(self, plan: Any) -> bool:
        name = str(plan.getClass().getName())
        return bool(self._command.isInstance(plan)) or _short(name) in _COMMANDS

    def nodes(self, root: Any, views: Collection[str]) -> Iterator[str]:
        for name, _ in self._walk(root, views, leaves=False):
            yield name

    def members(self, seq: Any) -> tuple[list[str], Any]:
        """The class names of a Scala sequence's members (three calls for all), and the
        members as a Java array (:meth:`_at` fetches one)."""
        array = seq.toArray(self._any)
        shown = str(self._shown(self._classes(array)))  # {class a.B,class c.D}
        names = [entry.removeprefix("class ") for entry in shown[1:-1].split(",")]
        return (names if shown != "{}" else []), array

    def _at(self, array: Any, index: int) -> Any:
        return self._get(array, index)

    def _walk(
        self, root: Any, views: Collection[str], leaves: bool = True, wanted: Collection[str] = ()
    ) -> Iterator[tuple[str, Any]]:
        """Each node once, as (class name, JVM node); ``leaves=False``: an expression of a
        known class that holds no subquery comes as (name, None), but for the classes
        ``wanted`` (short names)."""
        stack: list[tuple[str | None, Any]] = [(None, root)]
        fetch = _Fetch(leaves, frozenset(wanted), self._kinds)
        while stack:
            name, node = stack.pop()
            if node is None:
                yield name or "", None
                continue
            name = name or str(self._class_name(node))
            is_plan, _, is_leaf = self._kind(name, node)
            if not is_plan:
                yield from self._expression(node, stack, fetch)
                continue
            if _short(name) == "View":
                if self._own_view(node, views):
                    continue
                raise RefusedStatementError(f"{_CONSTRUCTS['View']} is not allowed here")
            yield name, node
            if _short(name) == "UnresolvedWith":  # a parsed plan's CTE bodies
                stack.extend((None, pair._2()) for pair in _list(node.cteRelations()))
            if not is_leaf:
                self._push(stack, node.children(), None)
            self._push(stack, node.expressions(), fetch)

    def _expression(
        self, root: Any, stack: list[tuple[str | None, Any]], fetch: _Fetch
    ) -> Iterator[tuple[str, Any]]:
        """An expression and every expression under it, in Spark's order (the plans of
        its subqueries are put on the ``stack``)."""
        names, array = self.members(root.map(self._identity))
        for index, name in enumerate(names):
            node = self._at(array, index) if fetch.node(name, leaf=False) else None
            if node is not None and self._kind(name, node)[1]:  # a subquery is fetched
                stack.append((None, node.plan()))
            yield name, node

    def _push(self, stack: list[tuple[str | None, Any]], seq: Any, fetch: _Fetch | None) -> None:
        """The members of a sequence of plan nodes or expressions, onto the stack (each
        fetched if ``fetch`` says so, or if it is None)."""
        names, array = self.members(seq)
        for index, name in enumerate(names):
            fetched = fetch is None or fetch.node(name, leaf=True)
            stack.append((name, self._at(array, index) if fetched else None))

    def _kind(self, name: str, node: Any) -> tuple[bool, bool, bool]:
        kind = self._kinds.get(name)
        if kind is None:
            kind = (bool(self._plan.isInstance(node)), bool(self._subquery.isInstance(node)),
                    bool(self._leaf.isInstance(node)))  # fmt: skip
            self._kinds[name] = kind
        return kind

    @staticmethod
    def _own_view(node: Any, views: Collection[str]) -> bool:
        identifier = node.desc().identifier()
        return (
            bool(node.isTempView())
            and not identifier.database().isDefined()
            and str(identifier.table()).lower() in views
        )


class _Fetch:
    """Whether a walk needs a node itself, not only its class: always if ``leaves``;
    otherwise for a class not seen yet, a subquery, a class ``wanted`` and (``leaf=True``:
    at the top of an expression) anything but a leaf expression, whose class says all."""

    def __init__(self, leaves: bool, wanted: frozenset[str], kinds: dict[str, Any]) -> None:
        self.leaves, self.wanted, self.kinds = leaves, wanted, kinds

    def node(self, name: str, leaf: bool) -> bool:
        kind = self.kinds.get(name)
        if self.leaves or kind is None or kind[1] or _short(name) in self.wanted:
            return True
        return leaf and kind != (False, False, True)


def analyzed_nodes(
    spark: SparkSession, frame: DataFrame, views: Collection[str]
) -> Iterator[tuple[str, Any, bool]]:
    """Each node of a guarded frame's analyzed plan, its expressions and the plans of
    its subqueries, as (short class name, JVM node, is a plan node); the binder's
    ``views`` are leaves (their insides are the sources, not the query). For readers of
    the plan's shape, such as the dynamic tables' refresh-mode classifier."""
    walker = _walker(spark)
    root = frame._jdf.queryExecution().analyzed()
    for name, node in walker._walk(root, views):
        yield _short(name), node, walker._kind(name, node)[0]


def members(spark: SparkSession, seq: Any) -> tuple[list[str], Any]:
    """The class names of the members of a Scala sequence of JVM objects, in few calls, and
    the members as a Java array (``array[i]`` fetches one)."""
    return _walker(spark).members(seq)


def _list(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


_WALKERS: dict[int, _Walker] = {}


def _walker(spark: SparkSession) -> _Walker:
    key = id(spark._jsparkSession)  # type: ignore[attr-defined]
    walker = _WALKERS.get(key)
    if walker is None:
        walker = _WALKERS[key] = _Walker(spark)
    return walker


def _short(class_name: str) -> str:
    return class_name.rsplit(".", 1)[-1]


#: Classes of the refused functions (the message names the function, not the class).
_DENIED_CLASSES = {
    "CallMethodViaReflection": "reflect", "TryReflect": "try_reflect",
    "InputFileName": "input_file_name", "InputFileBlockStart": "input_file_block_start",
    "InputFileBlockLength": "input_file_block_length", "CurrentUser": "current_user",
    "XPathBoolean": "xpath_boolean", "XPathString": "xpath_string", "XPathList": "xpath",
    "XmlToStructs": "from_xml", "SchemaOfXml": "schema_of_xml", "SparkVersion": "version",
}  # fmt: skip
#: Parsed plans that are commands whatever their base class.
_COMMANDS = {"InsertIntoDir", "InsertIntoStatement", "CacheTable", "UncacheTable",
             "SetCommand", "ResetCommand"}  # fmt: skip
