"""Reading a checkpoint's state with Spark's state data sources, per operator, store and state variable: what
deep verify (state_check.py) and a migration run (spark_jobs/runtime/migration.py) share. Only pyspark here:
the runtime imports it, and the tools import the runtime."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession


def state_reads(metadata_row: Any) -> list[tuple[str, dict[str, str]]]:
    """(label, reader options) for each state instance of one operator/store row of `state-metadata`."""
    options = {"operatorId": str(metadata_row.operatorId)}
    if "transformWithState" in (metadata_row.operatorName or ""):
        properties = json.loads(metadata_row.operatorProperties or "{}")
        names = [v.get("stateName") for v in properties.get("stateVariables", []) if v.get("stateName")]
        return [(f"var:{name}", options | {"stateVarName": name}) for name in names]
    if metadata_row.stateStoreName and metadata_row.stateStoreName != "default":
        return [(metadata_row.stateStoreName, options | {"storeName": metadata_row.stateStoreName})]
    return [("default", options)]


def read_state(spark: SparkSession, location: str, batch: int, options: dict[str, str]) -> DataFrame:
    reader = spark.read.format("statestore").option("batchId", batch)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(location)
