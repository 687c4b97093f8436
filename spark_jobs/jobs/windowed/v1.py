"""Windowed job v1: events per (user, minute)."""

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

KEYS = ["user"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    return file_sink(output_columns(window_counts(events(spark, args), KEYS), KEYS, "v1"), args)


if __name__ == "__main__":
    run(build)
