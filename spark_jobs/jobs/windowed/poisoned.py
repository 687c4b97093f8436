"""Windowed job "poisoned": state-compatible with v1 and v2 (it passes the pre-flight) and runs like v2,
but the batch that reads an event of user `poison` (spark_jobs.generate.write_poison) fails. Fed after it
has committed a few batches, it is the upgrade that goes wrong late: its output for those batches is
already in the file sink when its health gate fails, so the rollback must rewind the sink (move that
output aside) for the old version to write those batches again, every event exactly once."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.generate import POISON_USER
from spark_jobs.jobs.windowed.common import counts_job
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user"]


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    poisoned = F.when(F.col("user") == POISON_USER, F.raise_error(F.lit("poisoned event: this version fails")))
    return counts_job(spark, job_args, KEYS, "poisoned", where=poisoned.otherwise(F.lit(True)))


if __name__ == "__main__":
    run(build)
