"""Rescale, as its own Spark application: repartition the state of a STOPPED checkpoint with Spark's
offline repartition (pyspark 4.2+, experimental). The engine runs it only on a freshly restored copy,
never on a live or original checkpoint: a failed attempt can leave an uncommitted batch behind.

    spark-submit repartition.py --checkpoint DIR --partitions N --out result.json
"""

from __future__ import annotations

import argparse

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark_jobs.tools.app import describe_error, run_tool


def repartition(spark: SparkSession, checkpoint: str, partitions: int) -> dict[str, object]:
    result: dict[str, object] = {"partitions": partitions}
    try:
        spark._streamingCheckpointManager.repartition(checkpoint, partitions)
        result["ok"] = True
    except PySparkException as exc:
        result.update(ok=False, error_class=exc.getCondition(), error=describe_error(exc))
    except Exception as exc:  # a JVM error that pyspark does not map: report it, the engine decides
        result.update(ok=False, error_class=type(exc).__name__, error=describe_error(exc))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    run_tool("savepoints-repartition", args.out, lambda spark: repartition(spark, args.checkpoint, args.partitions))


if __name__ == "__main__":
    main()
