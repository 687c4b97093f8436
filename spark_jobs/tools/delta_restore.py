"""Rewind a Delta table sink, as its own Spark application: Delta's RESTORE of the table to the version a
snapshot recorded (airflow_plugin/core/sinks/delta.py decides when and to which version). The files it
takes out of the table stay where they are until VACUUM; RESTORE to the version before it undoes it.

    spark-submit delta_restore.py --table s3a://bucket/out --version 7 --out result.json

The engine passes the job's jars (Delta's among them), its S3A settings and Delta's session extension.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from spark_jobs.tools.app import run_tool


def restore(spark: SparkSession, table: str, version: int) -> dict[str, object]:
    quoted = table.replace("`", "``")
    before = spark.sql(f"DESCRIBE HISTORY delta.`{quoted}` LIMIT 1").collect()[0]["version"]
    metrics = spark.sql(f"RESTORE TABLE delta.`{quoted}` TO VERSION AS OF {int(version)}").collect()
    after = spark.sql(f"DESCRIBE HISTORY delta.`{quoted}` LIMIT 1").collect()[0]["version"]
    return {
        "table": table,
        "restored_to_version": version,
        "version_before": int(before),
        "version_after": int(after),
        "metrics": metrics[0].asDict() if metrics else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", required=True)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    run_tool("savepoints-delta-restore", args.out, lambda spark: restore(spark, args.table, args.version))


if __name__ == "__main__":
    main()
