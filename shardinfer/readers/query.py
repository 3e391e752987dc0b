"""`input.query`: DuckDB SQL over a view named `input`, applied batch by batch.

A job is cut into splits that run on different workers and at different times, so the query must
give the same rows whether it sees the whole input or a slice of it. That holds exactly for
row-wise queries: one `SELECT ... FROM input [WHERE ...]` with computed columns. The query is
parsed (DuckDB's own parser, `json_serialize_sql`) and refused before the job starts if it has
anything that looks across rows or is not a pure function of the row:

  aggregates, GROUP BY / HAVING, window functions, QUALIFY, ORDER BY, LIMIT/OFFSET, DISTINCT,
  joins, subqueries, CTEs, UNION and other set operations, UNNEST (one row becoming several would
  duplicate row ids), SAMPLE, and volatile functions such as random(), now() or current_date.

Every connection runs in the UTC time zone, so time-zone-aware functions give every worker the
same rows. `__row_index` always passes through: if the select list has no `*` and does not name
it, it is added in front, so row ids stay `"{file_index}:{row_index}"` of the original row; a
result whose `__row_index` is not the input rows' own, in order, is refused.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from shardinfer.errors import InputQueryError
from shardinfer.splits import ROW_INDEX_COLUMN

_HINT = (
    "only row-wise queries are supported (SELECT columns or expressions FROM input WHERE ...), because "
    "the query runs on each split separately; do aggregations, joins and sorting before the job"
)
_ROW_MULTIPLYING = {"unnest", "generate_subscripts"}


def _connect() -> duckdb.DuckDBPyConnection:
    # One thread: the result order is the input order, and the reader stays within its CPU share.
    con = duckdb.connect(config={"threads": 1})
    # Time-zone-aware functions and casts (year(), strftime(), a TIMESTAMPTZ as text) follow the
    # session's time zone, by default the machine's: pinned, every worker computes the same rows.
    try:
        con.execute("LOAD icu")
        con.execute("SET TimeZone = 'UTC'")
    except duckdb.Error:
        pass  # a DuckDB built without ICU has no time zones but UTC
    return con


# SQL's clock keywords, written without parentheses: the parser gives them as column references
# (a column of that name would win), bound to the current time only later.
_CLOCK_KEYWORDS = {"current_date", "current_time", "current_timestamp", "localtime", "localtimestamp"}

# Functions of the current time that DuckDB lists as consistent in some form: age(ts) is the
# time from ts to now (age(a, b), with two arguments, is a pure function).
_NOW_WITH_ONE_ARGUMENT = {"age"}


@cache
def _function_kinds() -> tuple[frozenset[str], frozenset[str]]:
    """(names of aggregate and window functions, names of non-deterministic scalar functions).

    A scalar function is non-deterministic when none of its forms is deterministic: `+` stays
    allowed although `timestamptz + interval` depends on the session's time zone (which
    `_connect` pins), while `now()` and `random()` have no deterministic form at all."""
    con = _connect()
    try:
        rows = con.execute(
            "SELECT DISTINCT function_name, function_type, stability FROM duckdb_functions()"
        ).fetchall()
    finally:
        con.close()
    across = frozenset(name.lower() for name, kind, _ in rows if kind in ("aggregate", "window"))
    scalar = [(name.lower(), stability) for name, kind, stability in rows if kind == "scalar"]
    consistent = {name for name, stability in scalar if stability == "CONSISTENT"}
    volatile = frozenset(name for name, _ in scalar if name not in consistent)
    return across, volatile


def _reads_the_clock(name: str, node: dict[str, Any]) -> bool:
    # The argument list's key changed between DuckDB versions.
    arguments = node.get("arguments", node.get("children", []))
    return name in _NOW_WITH_ONE_ARGUMENT and len(arguments) == 1


def _walk(node: Any, query: str) -> None:
    """Refuse any expression that looks across rows or is not a function of the row alone."""
    across, volatile = _function_kinds()
    if isinstance(node, list):
        for item in node:
            _walk(item, query)
        return
    if not isinstance(node, dict):
        return
    cls = node.get("class")
    names = node.get("column_names", [])
    if cls == "COLUMN_REF" and len(names) == 1 and str(names[0]).lower() in _CLOCK_KEYWORDS:
        raise InputQueryError(
            f"input.query {query!r} uses {names[0]}, which changes from run to run; a "
            "resumed job would not reproduce it; compute such values before the job"
        )
    if cls == "WINDOW":
        raise InputQueryError(f"input.query {query!r} uses a window function; {_HINT}")
    if cls == "SUBQUERY":
        raise InputQueryError(f"input.query {query!r} has a subquery; {_HINT}")
    if cls == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        if name in across or name == "count_star":
            raise InputQueryError(f"input.query {query!r} uses the aggregate {name}(); {_HINT}")
        if name in _ROW_MULTIPLYING:
            raise InputQueryError(
                f"input.query {query!r} uses {name}(), which turns one row into several and would "
                f"duplicate row ids; {_HINT}"
            )
        if name in volatile or _reads_the_clock(name, node):
            raise InputQueryError(
                f"input.query {query!r} uses {name}(), whose result changes from run to run; a resumed "
                "job would not reproduce it; compute such values before the job"
            )
    for value in node.values():
        _walk(value, query)


def _check_select(node: dict[str, Any], query: str) -> None:
    if node.get("type") != "SELECT_NODE":
        raise InputQueryError(f"input.query {query!r} is a set operation (UNION, EXCEPT, ...); {_HINT}")
    if node.get("cte_map", {}).get("map"):
        raise InputQueryError(f"input.query {query!r} has a WITH clause; {_HINT}")
    for modifier in node.get("modifiers", []):
        what = {
            "ORDER_MODIFIER": "ORDER BY",
            "LIMIT_MODIFIER": "LIMIT/OFFSET",
            "DISTINCT_MODIFIER": "DISTINCT",
        }
        label = what.get(modifier.get("type"), modifier.get("type"))
        raise InputQueryError(f"input.query {query!r} uses {label}; {_HINT}")
    if node.get("group_expressions") or node.get("having") or node.get("qualify"):
        raise InputQueryError(f"input.query {query!r} uses GROUP BY / HAVING / QUALIFY; {_HINT}")
    if node.get("sample"):
        raise InputQueryError(f"input.query {query!r} uses SAMPLE; {_HINT}")
    source = node.get("from_table") or {}
    if source.get("type") != "BASE_TABLE" or str(source.get("table_name", "")).lower() != "input":
        raise InputQueryError(
            f"input.query {query!r} must read from the view `input` alone (no joins, table functions "
            f"or other tables); {_HINT}"
        )
    if source.get("sample"):
        raise InputQueryError(f"input.query {query!r} uses TABLESAMPLE; {_HINT}")
    _walk([node.get("select_list"), node.get("where_clause")], query)


def _keeps_row_index(select_list: list[dict[str, Any]]) -> bool:
    for item in select_list:
        if item.get("class") == "STAR":
            excluded = {str(x).lower() for x in item.get("exclude_list", [])}
            if ROW_INDEX_COLUMN not in excluded:
                return True
        if item.get("class") == "COLUMN_REF" and item.get("column_names", [""])[-1] == ROW_INDEX_COLUMN:
            return True
    return False


@cache
def prepare_query(query: str) -> str:
    """The SQL to run per batch: `query` validated as row-wise, with `__row_index` kept."""
    con = _connect()
    try:
        parsed = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchone()[0])  # type: ignore[index]
        if parsed.get("error"):
            raise InputQueryError(
                f"input.query {query!r} cannot be used: {parsed.get('error_message')}; write one "
                "SELECT ... FROM input [WHERE ...] statement"
            )
        statements = parsed.get("statements", [])
        if len(statements) != 1:
            raise InputQueryError(
                f"input.query {query!r} holds {len(statements)} statements; give exactly one"
            )
        node = statements[0]["node"]
        _check_select(node, query)
        if _keeps_row_index(node["select_list"]):
            return query
        node["select_list"].insert(
            0, {"class": "COLUMN_REF", "type": "COLUMN_REF", "alias": "", "column_names": [ROW_INDEX_COLUMN]}
        )
        return str(con.execute("SELECT json_deserialize_sql(?)", [json.dumps(parsed)]).fetchone()[0])  # type: ignore[index]
    except duckdb.Error as exc:
        raise InputQueryError(f"input.query {query!r} cannot be parsed: {exc}") from exc
    finally:
        con.close()


class QueryFailed(InputQueryError):
    """DuckDB could not run the query on a batch; `detail` is its own message, and `by_value` says
    whether the failure is one a value causes (a conversion, an out-of-range number, text a
    function cannot parse) rather than the machine's (memory, an internal error)."""

    def __init__(self, message: str, detail: str, by_value: bool) -> None:
        super().__init__(message)
        self.detail = detail
        self.by_value = by_value


def _same_rows(before: pa.Array, after: pa.ChunkedArray) -> bool:
    """Whether the query's `__row_index` values are input rows' own, in input order, each once:
    row ids and the split's row accounting are built from them, so a computed one (`__row_index + 1
    AS __row_index`) would give rows another row's id. The input's are strictly increasing."""
    values = after.combine_chunks()
    if len(values) == 0:
        return True
    if values.null_count:
        return False
    if len(values) > 1 and not pc.all(pc.less(values[:-1], values[1:])).as_py():
        return False
    return bool(pc.all(pc.is_in(values, value_set=before)).as_py())


def _keep_field_metadata(result: pa.Table, input_schema: pa.Schema) -> pa.Table:
    """`result` with the field metadata of each input column it passes on under the same name and
    type. DuckDB drops field metadata, and the reader's marks live there (a JSONL column read as
    JSON text, jsonl_source.is_json_text): without them that text would be taken at face value."""
    fields = []
    for field in result.schema:
        index = input_schema.get_field_index(field.name)
        source = input_schema.field(index) if index >= 0 else None
        keep = source is not None and source.metadata and not field.metadata and source.type == field.type
        fields.append(field.with_metadata(source.metadata) if keep and source is not None else field)
    schema = pa.schema(fields, metadata=result.schema.metadata)
    return (
        result
        if schema.equals(result.schema, check_metadata=True)
        else pa.Table.from_arrays(result.columns, schema=schema)
    )


class QueryRunner:
    """Runs the prepared query over one batch at a time (the view `input` is that batch)."""

    def __init__(self, query: str, where: str) -> None:
        self._original = query
        self._sql = prepare_query(query)
        self._where = where  # the file the batches come from, for error messages
        self._con = _connect()

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        table = pa.Table.from_batches([batch])
        self._con.register("input", table)
        try:
            result = self._con.sql(self._sql).to_arrow_table()
        except duckdb.Error as exc:
            raise QueryFailed(
                f"input.query {self._original!r} failed on {self._where}: {exc}; the input's columns "
                f"are {[n for n in table.column_names if n != ROW_INDEX_COLUMN]}",
                str(exc),
                isinstance(exc, duckdb.DataError | duckdb.InvalidInputException),
            ) from exc
        finally:
            self._con.unregister("input")
        index = result.schema.get_field_index(ROW_INDEX_COLUMN)
        if (
            index < 0
            or not pa.types.is_int64(result.schema.field(index).type)
            or not _same_rows(batch.column(ROW_INDEX_COLUMN), result.column(index))
        ):
            raise InputQueryError(
                f"input.query {self._original!r} must keep {ROW_INDEX_COLUMN} (int64) unchanged; do not "
                "exclude, rename or compute it"
            )
        return _keep_field_metadata(result, table.schema)

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The schema of the query's result on rows of `input_schema` (runs it on zero rows)."""
        return self(pa.RecordBatch.from_pylist([], schema=input_schema)).schema

    def close(self) -> None:
        self._con.close()
