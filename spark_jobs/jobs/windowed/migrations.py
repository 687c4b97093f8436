"""Migration functions of the windowed job (jobs file `migrate = "spark_jobs.jobs.windowed.migrations:..."`).

`per_country`: v3's state (per user, country and window) into by_country's initial state (per country and
window). v3 keeps two operators: the aggregation's counts per (window, user, country), summed here per (window,
country); and, from Kafka, the deduplication's seqs (each with the time it expires: its event time plus the
watermark delay), which by_country keeps per key to drop a retried record. v3 does not keep a seq's country, so
each seq is given to every country of its window: a retry lands on its own country's key, which holds it."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.jobs.windowed.by_country import INITIAL_STATE
from spark_jobs.jobs.windowed.common import WATERMARK_DELAY, WINDOW
from spark_jobs.runtime.migration import OldState

AGGREGATION = "stateStoreSave"  # Spark's name of a streaming aggregation's operator
DEDUPLICATION = "dedupeWithinWatermark"


def per_country(old: OldState) -> DataFrame:
    counts = (
        old.read(AGGREGATION)
        .groupBy(F.col("key.window.start").alias("window_start"), F.col("key.country").alias("country"))
        .agg(F.sum("value.count").cast("long").alias("events"))
    )
    if not any(operator.name == DEDUPLICATION for operator in old.operators):  # a file source: no deduplication
        return counts.withColumn("seen", F.array().cast("array<long>")).select(*INITIAL_STATE.schema.fieldNames())
    event_time = F.timestamp_micros(F.col("value.expiresAtMicros")) - F.expr(f"INTERVAL {WATERMARK_DELAY}")
    seqs = old.read(DEDUPLICATION).select(
        F.window(event_time, WINDOW).start.alias("window_start"), F.col("key.seq").alias("seq")
    )
    seen = (
        counts.select("window_start", "country")
        .join(seqs, "window_start")
        .groupBy("window_start", "country")
        .agg(F.collect_list("seq").alias("seen"))
    )
    return (
        counts.join(seen, ["window_start", "country"], "left")
        .withColumn("seen", F.coalesce("seen", F.array().cast("array<long>")))
        .select(*INITIAL_STATE.schema.fieldNames())
    )
