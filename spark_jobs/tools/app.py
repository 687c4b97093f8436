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
    try:
        result = work(spark)
    finally:
        spark.stop()
    Path(out).write_text(json.dumps(result))
