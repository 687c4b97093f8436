"""Windowed job v2, a state-compatible upgrade of v1: the same state (key: user and window; value: the
count), plus a filter that drops malformed events before the aggregation (a filter does not change the
state schema; the generator writes none, so counts stay exact) and a new output column computed after
the aggregation, `events_per_second`."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.jobs.windowed.common import (
    apply_job_conf,
    events,
    file_sink,
    output_columns,
    parse_job_args,
    window_counts,
)
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user"]
WINDOW_SECONDS = 60.0


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    valid = events(spark, args).where(F.col("user").isNotNull() & F.col("seq").isNotNull())
    rate = F.round(F.col("events") / F.lit(WINDOW_SECONDS), 3).alias("events_per_second")
    return file_sink(output_columns(window_counts(valid, KEYS), KEYS, "v2", rate), args)


if __name__ == "__main__":
    run(build)
