"""Windowed job v3, NOT state-compatible with v1/v2: it adds `country` to the grouping keys, so the state
key schema grows by a column. Restored from a v1/v2 checkpoint, Spark rejects it when it plans a batch
against the old state (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE): the upgrade that must be caught."""

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

KEYS = ["user", "country"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    return file_sink(output_columns(window_counts(events(spark, args), KEYS), KEYS, "v3"), args)


if __name__ == "__main__":
    run(build)
