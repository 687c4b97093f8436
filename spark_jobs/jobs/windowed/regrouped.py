"""Windowed job "regrouped", a WRONG upgrade that Spark does not catch: it counts per country instead of
per user. Both keys are strings, so Spark's state schema check (which ignores field names) accepts the
old state and would silently read per-user counts as per-country ones. The pre-flight compares the
stored schema's field names and blocks it unless renames are allowed explicitly."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.windowed.common import (
    apply_job_conf,
    events,
    file_sink,
    output_columns,
    parse_job_args,
    window_counts,
)
from spark_jobs.runtime import StreamingJob, run

KEYS = ["country"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    return file_sink(output_columns(window_counts(events(spark, args), KEYS), KEYS, "regrouped"), args)


if __name__ == "__main__":
    run(build)
