"""Windowed job v1: events per (user, minute)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.windowed.common import counts_job
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    return counts_job(spark, job_args, KEYS, "v1")


if __name__ == "__main__":
    run(build)
