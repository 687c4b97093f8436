"""Hadoop fixtures: ONE mini HDFS and YARN per pytest session (`hadoop`), the drivers' Python environment packed
once and put on that HDFS (`driver_env`), and `hadoop_client` for a test that talks to them: HADOOP_CONF_DIR set
for that test only (set for the session, it would send every local Spark's relative paths to HDFS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_plugin.core.storage import HdfsStorage
from devtools.driver_env import ARCHIVE, pack
from devtools.hadoop import MiniHadoop


@pytest.fixture(scope="session")
def hadoop() -> Iterator[MiniHadoop]:
    with MiniHadoop() as cluster:
        yield cluster


@pytest.fixture
def hadoop_client(hadoop: MiniHadoop, monkeypatch: pytest.MonkeyPatch) -> MiniHadoop:
    """The cluster, with this process's Hadoop client configuration pointing at it for the test."""
    for key, value in hadoop.env().items():
        monkeypatch.setenv(key, value)
    return hadoop


@pytest.fixture(scope="session")
def driver_env(hadoop: MiniHadoop, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The hdfs:// URI of the drivers' environment archive (devtools/driver_env.py), for spark.archives."""
    archive = pack(tmp_path_factory.mktemp("driver-env"))
    envs = HdfsStorage(hadoop.hdfs_uri.removeprefix("hdfs://"), "/envs", [hadoop.webhdfs_address])
    envs.upload(archive, ARCHIVE)
    archive.unlink()
    return f"{envs.uri}/{ARCHIVE}"


def hdfs_root(hadoop: MiniHadoop, tmp_path: Path) -> str:
    """A directory of its own on the mini HDFS for one test."""
    return f"{hadoop.hdfs_uri}/tests/{tmp_path.name}"
