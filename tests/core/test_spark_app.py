"""What every Spark launch checks and sets: one version of pyspark's files, local Spark on loopback."""

from __future__ import annotations

import importlib.metadata

import pytest

from airflow_plugin.core.spark_app import check_pyspark_files, loopback_env, pyspark_conflict


def test_pyspark_and_pyspark_client_of_two_versions_are_refused_with_the_fix() -> None:
    problem = pyspark_conflict("4.2.1", "4.2.0")
    assert problem is not None
    assert "pyspark 4.2.1 and pyspark-client 4.2.0" in problem
    assert "pip install pyspark==4.2.1 pyspark-client==4.2.1" in problem
    assert pyspark_conflict("4.2.0", "4.2.0") is None
    assert pyspark_conflict("4.2.0", None) is None and pyspark_conflict(None, "4.2.0") is None


def test_this_environment_has_one_version_of_pyspark_files() -> None:
    """uv.lock installs pyspark and the Spark provider's pyspark-client at the same version."""
    assert importlib.metadata.version("pyspark") == importlib.metadata.version("pyspark-client")
    check_pyspark_files()


def test_local_spark_binds_loopback_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert loopback_env("local[2]") == {"SPARK_LOCAL_IP": "127.0.0.1"}
    assert loopback_env("yarn") == {} and loopback_env("spark://10.0.0.5:7077") == {}
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.7")
    assert loopback_env("local[2]") == {}
