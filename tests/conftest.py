"""Shared fixtures. `spark`: ONE local SparkSession for the whole pytest session."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from devtools.embedded_s3 import EmbeddedS3

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS = 3


def _require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        pytest.fail(
            "Spark tests need Java 17: no `java` on PATH and no JAVA_HOME "
            "(install it, e.g. `apt-get install -y openjdk-17-jre-headless`).",
            pytrace=False,
        )
    probe = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"`{java} -version` failed: {probe.stderr.strip()}", pytrace=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    _require_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback address" warning
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("spark-savepoints-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
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
