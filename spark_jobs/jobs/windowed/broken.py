"""Windowed job "broken": state-compatible with v1 (it passes the pre-flight, whose noop sink never
writes), but its file sink asks for a compression codec that does not exist, so its first real batch
after the restore fails. What an upgrade's health gate is for: the DAG rolls back to the old version
from the same savepoint."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_jobs.jobs.windowed.common import counts_job
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user"]
MISSING_CODEC = "zstd-turbo"  # not a Hadoop codec: the JSON writer refuses it when a batch is written


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    job = counts_job(spark, job_args, KEYS, "broken")
    job.writer.option("compression", MISSING_CODEC)
    return job


if __name__ == "__main__":
    run(build)
