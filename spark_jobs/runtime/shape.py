"""What a query is made of, read from Spark's analyzed plan: its event-time watermarks (column, delay), its
stateful operators, and whether a gate column is the end of a time window. An upgrade decides from it whether two
versions can split the output by window end (blue/green: core/upgrades/mode.py) and where a replay must start
(core/upgrades/replay.py). The runtime reports it in the status (`query_shape`) of every start and pre-flight.

Read through py4j from the JVM's plan objects, not their JSON (`toJSON` leaves out a watermark's delay and the
attributes' metadata): a window grouping carries `spark.timeWindow` (tumbling and sliding windows) or
`spark.sessionWindow` in its attribute's metadata, and a watermark's event-time attribute `spark.watermarkDelayMs`,
as Spark's analyzer sets them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

TIME_WINDOW, SESSION_WINDOW, DELAY = "spark.timeWindow", "spark.sessionWindow", "spark.watermarkDelayMs"
DEDUPLICATIONS = frozenset({"Deduplicate", "DeduplicateWithinWatermark", "Distinct"})


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _nodes(plan: Any) -> Iterator[Any]:
    yield plan
    for child in _seq(plan.children()):
        yield from _nodes(child)


def _kind(node: Any) -> str:
    return str(node.getClass().getSimpleName())


def _has(expression: Any, key: str) -> bool:
    return _kind(expression) == "AttributeReference" and bool(expression.metadata().contains(key))


def shape_of(query: DataFrame, gate_column: str | None) -> dict[str, Any]:
    """`{"watermarks": [{"column", "delay_ms"}], "stateful": [...], "gate_is_window_end": bool | None}`; the
    stateful operators as "time window aggregation", "session window aggregation", "aggregation", "deduplication",
    "stream-stream join" or "arbitrary state (<node>)". `{"unknown": why}` where the plan cannot be read."""
    try:
        plan = query._jdf.queryExecution().analyzed()  # type: ignore[attr-defined]
        return _read(plan, gate_column)
    except Exception as exc:  # Spark Connect, another Spark: nothing to read the plan with
        log.warning("the query's plan could not be read (%s): upgrades treat its shape as unknown", exc)
        return {"unknown": f"its plan could not be read ({type(exc).__name__})"}


def _read(plan: Any, gate_column: str | None) -> dict[str, Any]:
    watermarks, stateful, aliases = [], [], {}
    for node in _nodes(plan):
        kind = _kind(node)
        for expression in _seq(node.expressions()):
            if _kind(expression) == "Alias":
                aliases[int(expression.exprId().id())] = expression
        if kind == "EventTimeWatermark":
            column = node.eventTime()
            delay = next((a for a in _seq(node.output()) if a.exprId().equals(column.exprId())), None)
            delay_ms = int(delay.metadata().getLong(DELAY)) if delay is not None and _has(delay, DELAY) else None
            watermarks.append({"column": str(column.name()), "delay_ms": delay_ms})
        elif kind == "Aggregate" and node.isStreaming():
            grouping = _seq(node.groupingExpressions())
            if any(_has(g, TIME_WINDOW) for g in grouping):
                stateful.append("time window aggregation")
            elif any(_has(g, SESSION_WINDOW) for g in grouping):
                stateful.append("session window aggregation")
            else:
                stateful.append("aggregation")
        elif kind in DEDUPLICATIONS and node.isStreaming():
            stateful.append("deduplication")
        elif kind == "Join" and all(child.isStreaming() for child in _seq(node.children())):
            stateful.append("stream-stream join")
        elif "WithState" in kind:
            stateful.append(f"arbitrary state ({kind})")
    return {
        "watermarks": watermarks,
        "stateful": stateful,
        "gate_is_window_end": _window_end(plan, gate_column, aliases),
    }


def _window_end(plan: Any, gate_column: str | None, aliases: dict[int, Any]) -> bool | None:
    """Whether the output column `gate_column` is the end of a time window (`window.end`, under any name)."""
    if not gate_column:
        return None
    output = next((a for a in _seq(plan.output()) if str(a.name()) == gate_column), None)
    alias = aliases.get(int(output.exprId().id())) if output is not None else None
    if alias is None:
        return False
    field = alias.child()
    return _kind(field) == "GetStructField" and int(field.ordinal()) == 1 and _has(field.child(), TIME_WINDOW)
