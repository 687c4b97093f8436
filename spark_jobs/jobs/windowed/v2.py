"""Windowed job v2, a state-compatible upgrade of v1: the same state (key: user and window; value: the
count), plus a filter that drops malformed events before the aggregation (a filter does not change the
state schema; the generator writes none, so counts stay exact) and a new output column computed after
the aggregation, `events_per_second`."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.jobs.windowed.common import counts_job
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user"]
WINDOW_SECONDS = 60.0


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    valid = F.col("user").isNotNull() & F.col("seq").isNotNull()
    rate = F.round(F.col("events") / F.lit(WINDOW_SECONDS), 3).alias("events_per_second")
    return counts_job(spark, job_args, KEYS, "v2", rate, where=valid)


if __name__ == "__main__":
    run(build)
