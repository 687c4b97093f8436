"""Deep verify, as its own Spark application: read every operator's state at batch N from a restored
checkpoint with Spark's state data sources, and compare it row for row with the original checkpoint
while that still holds batch N. Writes a JSON result; the engine (core/snapshots/verify.py) reads it.

    spark-submit state_check.py --checkpoint DIR --batch N [--original LOCATION] --out result.json
"""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.tools.app import run_tool
from spark_jobs.tools.state_reader import read_state, state_reads


def check(spark: SparkSession, checkpoint: str, batch: int, original: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"batch_id": batch, "operators": [], "problems": []}
    try:
        metadata = spark.read.format("state-metadata").load(checkpoint).collect()
    except Exception as exc:
        result["problems"].append(f"state-metadata unreadable: {type(exc).__name__}: {str(exc)[:300]}")
        return result
    for row in metadata:
        for label, options in state_reads(row):
            entry: dict[str, Any] = {"operator": row.operatorId, "name": row.operatorName, "store": label}
            result["operators"].append(entry)
            try:
                restored = read_state(spark, checkpoint, batch, options).drop("partition_id").cache()
                entry["rows"] = restored.count()
                entry["partitions"] = row.numPartitions
            except Exception as exc:
                result["problems"].append(
                    f"operator {row.operatorId} store {label}: state at batch {batch} unreadable: "
                    f"{type(exc).__name__}: {str(exc)[:300]}"
                )
                continue
            if original is None:
                continue
            try:
                source = read_state(spark, original, batch, options).drop("partition_id")
                source_rows = source.count()
            except Exception as exc:  # the original has moved on and no longer holds batch N
                entry["matches_original"] = None
                entry["original"] = f"not compared: {type(exc).__name__}"
                continue
            missing = source.exceptAll(restored).count()
            extra = restored.exceptAll(source).count()
            entry["matches_original"] = missing == 0 and extra == 0 and source_rows == entry["rows"]
            if not entry["matches_original"]:
                result["problems"].append(
                    f"operator {row.operatorId} store {label}: restored state differs from the original at batch "
                    f"{batch} ({missing} rows missing, {extra} rows extra)"
                )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--original")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    run_tool("savepoints-state-check", args.out, lambda spark: check(spark, args.checkpoint, args.batch, args.original))


if __name__ == "__main__":
    main()
