"""user_totals "regrouped", a WRONG upgrade that Spark does not catch: the same state keyed by country
instead of user. Both are strings and Spark's check of transformWithState schemas ignores field names,
so it would read per-user totals as per-country ones. The pre-flight compares the names and blocks it."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.user_totals.common import totals_job
from spark_jobs.runtime import StreamingJob, run


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    return totals_job(spark, job_args, "country", "regrouped")


if __name__ == "__main__":
    run(build)
