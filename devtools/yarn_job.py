"""The example windowed job on Hadoop's mini cluster (devtools/hadoop.py), for the YARN test and demo: a jobs file
that deploys it to YARN in cluster mode with its checkpoints on the mini HDFS. What each setting is for is what
docs/clusters.md says of YARN, item by item."""

from __future__ import annotations

from pathlib import Path

from devtools.hadoop import MiniHadoop
from devtools.windowed import write_jobs_file


def spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def job_conf(
    driver_env: str, store_env: dict[str, str], attempts: int = 1, java_options: str | None = None
) -> dict[str, str]:
    """Spark conf for a driver in a YARN container of the mini cluster: the Python environment archive at
    `driver_env` (an hdfs:// URI, devtools/driver_env.py), the store reached with `store_env` (its endpoint and
    keys in the driver's environment), `attempts` attempts of the driver, and `java_options` for the driver's and
    executors' JVMs (the tests' flags, tests/conftest.py: YARN gives a container none of the NodeManager's
    environment but a few named variables, so JDK_JAVA_OPTIONS reaches a container's JVM only this way)."""
    loopback = {"SPARK_LOCAL_IP": "127.0.0.1"}  # one node: the driver and executor listen on loopback only
    jvm = {"JDK_JAVA_OPTIONS": java_options} if java_options else {}
    return {
        "spark.yarn.jars": f"local:{spark_jars()}/*",  # Spark's jars are on the node: nothing uploaded per application
        "spark.archives": f"{driver_env}#environment",
        "spark.pyspark.python": "./environment/bin/python",
        "spark.yarn.maxAppAttempts": str(attempts),
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        "spark.executor.instances": "1",
        "spark.executor.cores": "1",
        "spark.ui.enabled": "false",
        **{f"spark.yarn.appMasterEnv.{key}": value for key, value in {**store_env, **loopback, **jvm}.items()},
        **{f"spark.executorEnv.{key}": value for key, value in {**loopback, **jvm}.items()},
    }


def write_yarn_jobs_file(
    directory: Path,
    store: str,
    hadoop: MiniHadoop,
    driver_env: str,
    store_env: dict[str, str],
    attempts: int = 1,
    java_options: str | None = None,
) -> Path:
    """The windowed job's jobs file for YARN in cluster mode, checkpoints on the mini HDFS, input and output in
    `directory` (as file:// URIs: without a scheme a path in a YARN container is on HDFS), versions v1 and v2."""
    return write_jobs_file(
        directory,
        store,
        checkpoint_root=f"{hadoop.hdfs_uri}/checkpoints",
        source_args=("--input", f"file://{directory}/input"),
        sink_args=("--output", f"file://{directory}/output"),
        conf=job_conf(driver_env, store_env, attempts, java_options),
        table='spark_master = "yarn"\ndeploy_mode = "cluster"',
        versions=("v1", "v2"),
    )
