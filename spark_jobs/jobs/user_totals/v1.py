"""user_totals v1: running totals per user (transformWithState)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.user_totals.common import totals_job
from spark_jobs.runtime import StreamingJob, run


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    return totals_job(spark, job_args, "user", "v1")


if __name__ == "__main__":
    run(build)
