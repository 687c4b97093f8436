"""What the runtime reads from a query's analyzed plan (spark_jobs/runtime/shape.py), on real Spark plans, and what an
upgrade decides from it (core/upgrades/mode.py `window_problem`): blue/green only for one tumbling or sliding window
aggregation with one watermark whose end is the gate column; the others named with their reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_plugin.core.upgrades.mode import window_problem
from spark_jobs.runtime.shape import shape_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def _queries(spark: SparkSession) -> dict[str, tuple[DataFrame, str]]:
    from pyspark.sql import functions as F

    events = spark.readStream.format("rate").load().select(F.col("timestamp").alias("event_time"), "value")
    marked = events.withWatermark("event_time", "90 seconds")
    other = spark.readStream.format("rate").load().select(F.col("timestamp").alias("t2"), F.col("value").alias("v2"))
    counts = marked.groupBy(F.window("event_time", "1 minute"), "value").count()

    def per_session(key: Any, rows: Any, state: Any) -> Any:  # never run: only planned
        yield from ()

    return {
        "tumbling": (counts.select(F.col("window.end").alias("window_end"), "value", "count"), "window_end"),
        "window start as gate": (counts.select(F.col("window.start").alias("window_end"), "count"), "window_end"),
        "sliding": (
            marked.groupBy(F.window("event_time", "2 minutes", "1 minute")).count().select("window.end", "count"),
            "end",
        ),
        "deduplicated": (
            marked.dropDuplicatesWithinWatermark(["value"])
            .groupBy(F.window("event_time", "1 minute"))
            .count()
            .select(F.col("window.end").alias("window_end"), "count"),
            "window_end",
        ),
        "session": (
            marked.groupBy(F.session_window("event_time", "1 minute"))
            .count()
            .select(F.col("session_window.end").alias("window_end"), "count"),
            "window_end",
        ),
        "join": (
            marked.join(
                other.withWatermark("t2", "30 seconds"),
                F.expr("value = v2 AND t2 BETWEEN event_time AND event_time + INTERVAL 1 MINUTE"),
            ),
            "event_time",
        ),
        "stateless": (marked.select("event_time", "value"), "event_time"),
        "without watermark": (
            events.groupBy(F.window("event_time", "1 minute")).count().select(F.col("window.end").alias("e")),
            "e",
        ),
        "arbitrary state": (
            marked.groupBy("value").applyInPandasWithState(
                per_session, "value long", "count long", "append", "ProcessingTimeTimeout"
            ),
            "value",
        ),
    }


def test_the_plan_says_which_queries_split_at_a_window_end(spark: SparkSession) -> None:
    shapes = {name: shape_of(query, gate) for name, (query, gate) in _queries(spark).items()}
    one_watermark = [{"column": "event_time", "delay_ms": 90_000}]
    assert shapes["tumbling"] == {
        "watermarks": one_watermark,
        "stateful": ["time window aggregation"],
        "gate_is_window_end": True,
    }
    assert shapes["deduplicated"]["stateful"] == ["time window aggregation", "deduplication"]
    assert shapes["join"]["watermarks"] == [*one_watermark, {"column": "t2", "delay_ms": 30_000}]

    verdicts = {name: window_problem(shape, "the new version", "window_end") for name, shape in shapes.items()}
    assert verdicts["tumbling"] is None and verdicts["sliding"] is None and verdicts["deduplicated"] is None
    expected = {
        "window start as gate": "is not the end of its time window",
        "session": "holds a session window (a record one version drops as late and the other accepts",
        "join": "has 2 event-time watermarks",
        "stateless": "has no windowed state: its rows are written as they arrive",
        "without watermark": "has 0 event-time watermarks",
        "arbitrary state": "holds arbitrary state (FlatMapGroupsInPandasWithState)",
    }
    for name, why in expected.items():
        assert why in str(verdicts[name]), (name, verdicts[name])
