"""The Kafka broker of a job that declares one in the jobs file (`kafka = { bootstrap_servers = ... }`): the broker
every restore checks the job's offsets against, as the engine resolved it (its flag, connection or
$SAVEPOINTS_KAFKA_BOOTSTRAP winning over the jobs file). The engine hands it to the driver in its Spark conf
(`spark.savepoints.kafka.bootstrapServers`, every deploy mode) and environment ($SAVEPOINTS_KAFKA_BOOTSTRAP; a
script's driver sets it from the conf before the script runs, so in a cluster's container too), never among the
job's arguments: a script's own strict argparse would refuse an argument it did not ask for.

    from spark_jobs.runtime import kafka_bootstrap_servers

    def build(spark, job_args):
        reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap_servers(spark))
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from airflow_plugin.core.sources.kafka import KAFKA_CONF, KAFKA_ENV

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession


def kafka_bootstrap_servers(spark: SparkSession | None = None) -> str | None:
    """The broker the engine handed this driver: the Spark conf of `spark` (else of the driver's running Spark
    context: a job's build may call it without its session), else $SAVEPOINTS_KAFKA_BOOTSTRAP; None for a job
    that declares no `kafka`."""
    if spark is not None:
        conf = spark.conf.get(KAFKA_CONF, None)
    else:
        context = _running_context()
        conf = context.getConf().get(KAFKA_CONF) if context is not None else None
    return conf or os.environ.get(KAFKA_ENV) or None


def export_broker(spark: SparkSession) -> str | None:
    """Put the broker from the driver's conf into its environment, where a script may read it in any deploy mode
    (a driver in a cluster's container gets the conf, not the environment of spark-submit)."""
    broker = kafka_bootstrap_servers(spark)
    if broker:
        os.environ[KAFKA_ENV] = broker
    return broker


def _running_context() -> SparkContext | None:
    from pyspark import SparkContext

    return SparkContext._active_spark_context
