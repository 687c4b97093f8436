"""One way to build a local SparkSession for the tests and the benchmarks, and the Spark home spark-submit runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_plugin.core.spark_app import check_session_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_home() -> Path:
    """The Spark that spark-submit runs: SPARK_HOME, else the locked pyspark's own (as pyspark finds it)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def local_spark(app_name: str, shuffle_partitions: int = 3, **conf: str) -> SparkSession:
    """local[2], UI off, bound to 127.0.0.1, quiet; `conf` adds or overrides settings. Refuses (before any JVM
    starts) when pyspark's Python files and the JVM it would start are of two Spark versions."""
    from pyspark.sql import SparkSession

    check_session_spark()

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
