"""Shared fixtures. `spark`: ONE local SparkSession for the whole pytest session."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devtools import airflow_env, class_archive
from devtools.embedded_s3 import EmbeddedS3
from devtools.java import REQUIRED, java_major
from devtools.spark import local_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytest_plugins = ["tests.support.kafka_fixtures", "tests.support.hadoop_fixtures"]
SHUFFLE_PARTITIONS = 3
# Every JVM the tests start (the session's Spark, spark-submit drivers, pre-flights, the broker, the mini cluster)
# runs with flags for short lives on 2 cores; the product sets no JVM flag. C1 only: the tests' JVMs live for
# seconds to minutes, where C2's compile threads cost more CPU than its code saves. The serial collector: G1's
# concurrent threads and barriers cost more than the small heaps need. No code cache flushing (with room for it):
# Java 17's sweeper thread took 15% of a driver's CPU, following the classes Spark generates for every batch.
# Measured on the Kafka job's driver (Delta on the embedded S3): CPU per batch 4.6 s with C1 alone, 3.1 s with all.
os.environ.setdefault(
    "JDK_JAVA_OPTIONS",
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UseCodeCacheFlushing -XX:ReservedCodeCacheSize=512m",
)
# ... and every spark-submit (the session's, drivers', pre-flights') maps one archive of Spark's classes instead of
# loading them again: a driver starts seconds sooner (devtools/class_archive.py; made once per clone, two minutes of
# one core: in the background, while the first tests run on the other; the drivers they start go without it).
# The workers of `make test` inherit the options, and the builder's pid for the session's JVM to wait for.
ARCHIVE_BUILDER = None
if "SPARK_SUBMIT_OPTS" not in os.environ:
    ARCHIVE_OPTS, ARCHIVE_BUILDER = class_archive.start()
    if ARCHIVE_OPTS:
        os.environ["SPARK_SUBMIT_OPTS"] = ARCHIVE_OPTS
# Airflow reads its configuration when first imported: a private AIRFLOW_HOME for this test session.
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="savepoints-airflow-"))
airflow_env.configure(AIRFLOW_HOME)


def _require_java() -> None:
    major = java_major()
    if major is None or major < REQUIRED:
        pytest.fail(
            f"Spark tests need Java {REQUIRED}+ (found: {major or 'none'}): install it, e.g. "
            "`apt-get install -y openjdk-17-jre-headless`, or set JAVA_HOME.",
            pytrace=False,
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    if ARCHIVE_BUILDER is not None:  # the archive's maker, started above: not left behind
        ARCHIVE_BUILDER.wait()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that take longest first. `make test` runs whole files on two workers (`-n 2 --dist loadfile
    --no-loadscope-reorder`): each worker starts on the longest file it is given and the short tests fill in at the
    end, so neither waits alone for the end-to-end scenario. A file's cost: its slow tests (the marker's `seconds`,
    60 unless told), then its Spark tests."""

    def cost(item: pytest.Item) -> int:
        if slow := item.get_closest_marker("slow"):
            return int(slow.kwargs.get("seconds", 60))
        return 5 if item.get_closest_marker("spark") else 0

    per_file: dict[Path, int] = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0) + cost(item)
    items.sort(key=lambda item: -per_file[item.path])  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    _require_java()
    class_archive.wait_for_builder()  # a JVM for the whole session: one that maps the archive
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback address" warning
    # Python workers (transformWithState's, UDFs') run this interpreter, with the project's packages (protobuf)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = local_spark(
        "spark-savepoints-tests",
        SHUFFLE_PARTITIONS,
        **{
            "spark.default.parallelism": "2",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.streaming.stopTimeout": "30s",
            # Spark starts state maintenance once per JVM, at the interval of the first stateful query's session:
            # the tests that wait for snapshots and cleanup (tests/support/spark_kinds.py) need it short whichever
            # test runs first (their own conf comes too late once another stateful query started it)
            "spark.sql.streaming.stateStore.maintenanceInterval": "100ms",
        },
    )
    try:
        yield session
    finally:
        session.stop()


# --- the embedded S3 server (moto server mode on 127.0.0.1): one per test session ---


@pytest.fixture(scope="session")
def s3_server() -> Iterator[EmbeddedS3]:
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    with EmbeddedS3() as server:
        server.apply_env()
        yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_store(s3_server: EmbeddedS3) -> str:
    """A fresh bucket per test: s3://<bucket>/snapshots."""
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/snapshots"


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """The migrated sqlite metadata DB that `dag.test()` needs."""
    airflow_env.migrate(AIRFLOW_HOME)
    return AIRFLOW_HOME
