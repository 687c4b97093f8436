"""Windowed job v3, NOT state-compatible with v1/v2: it adds `country` to the grouping keys, so the state
key schema grows by a column. Restored from a v1/v2 checkpoint, Spark rejects it when it plans a batch
against the old state (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE): the upgrade that must be caught."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.windowed.common import counts_job
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user", "country"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    return counts_job(spark, job_args, KEYS, "v3")


if __name__ == "__main__":
    run(build)
