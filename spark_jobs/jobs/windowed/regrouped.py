"""Windowed job "regrouped", a WRONG upgrade that Spark does not catch: it counts per country instead of
per user. Both keys are strings, so Spark's state schema check (which ignores field names) accepts the
old state and would silently read per-user counts as per-country ones. The pre-flight compares the
stored schema's field names and blocks it unless renames are allowed explicitly."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.windowed.common import counts_job
from spark_jobs.runtime import StreamingJob, run

KEYS = ["country"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    return counts_job(spark, job_args, KEYS, "regrouped")


if __name__ == "__main__":
    run(build)
