"""What each engine tool shares: one SparkSession for one piece of work, stopped whatever happens, and
the result written as JSON where the engine (core/spark_app.py) reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


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
    """The error and, for one from the JVM, its root cause (the last 'Caused by', which Spark's own message
    often wraps out of sight), within `limit` characters."""
    text = str(exc)
    cause, root = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None), None
    for _ in range(20):  # a cause chain is short; never loop on a cyclic one
        try:
            cause = cause.getCause() if cause is not None else None
        except Exception:  # not a Java object after all
            break
        if cause is None:
            break
        root = cause
    if root is not None:
        text = f"{text[: limit // 2]} ... caused by: {root.toString()}"
    return text[:limit]
