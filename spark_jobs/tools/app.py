"""What each engine tool shares: one SparkSession for one piece of work, stopped whatever happens, and
the result written as JSON where the engine (core/spark_app.py) reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.runtime.failure import root_cause


def run_tool(app_name: str, out: str, work: Callable[[SparkSession], dict[str, Any]]) -> None:
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # Spark 4.2's state readers (and offline repartition) load state stores, which report to the
    # StateStoreCoordinator; only the session's streaming query manager registers it, and a tool starts no
    # query: without this they fail with CANNOT_LOAD_STATE_STORE (RpcEndpointNotFoundException).
    spark.streams.active  # noqa: B018
    try:
        result = work(spark)
    finally:
        spark.stop()
    Path(out).write_text(json.dumps(result))


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    """The error and, for one from the JVM, its root cause, within `limit` characters."""
    text, root = str(exc), root_cause(exc)
    if root is not None:
        text = f"{text[: limit // 2]} ... caused by: {root}"
    return text[:limit]
