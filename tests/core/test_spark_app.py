"""What every Spark launch checks and sets: one version of pyspark's files, local Spark on loopback; and that a
SparkSession started here gets the JVM of pyspark's own version."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

import pytest

from airflow_plugin.core import spark_app
from airflow_plugin.core.errors import LaunchFailed
from airflow_plugin.core.spark_app import check_pyspark_files, loopback_env, pyspark_conflict, spark_home_conflict
from devtools.airflow_env import REPO
from devtools.spark import local_spark

PYSPARK = importlib.metadata.version("pyspark")


def fake_spark_home(root: Path, version: str) -> Path:
    """A Spark home as a distribution lays it out, as far as the check reads it."""
    (root / "jars").mkdir(parents=True)
    for name in (f"spark-core_2.13-{version}.jar", f"spark-sql_2.13-{version}.jar", "py4j-0.10.9.9.jar"):
        (root / "jars" / name).touch()
    return root


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


def test_a_spark_home_of_another_version_is_named_with_the_fix(tmp_path: Path) -> None:
    other = fake_spark_home(tmp_path / "spark-4.3.0", "4.3.0")
    problem = spark_home_conflict("4.2.0", str(other))
    assert problem is not None
    assert f"SPARK_HOME={other} holds Spark 4.3.0" in problem and "pyspark is 4.2.0" in problem
    assert "Unset SPARK_HOME" in problem
    assert spark_home_conflict("4.3.0", str(other)) is None
    assert spark_home_conflict("4.2.0", None) is None and spark_home_conflict("4.2.0", "") is None
    assert spark_home_conflict("4.2.0", str(tmp_path)) is None  # no jars: nothing to compare


def test_local_spark_refuses_two_spark_versions_before_a_jvm_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 4.2 over Spark 4.3's jars (a foreign SPARK_HOME, or pyspark-client's files over pyspark's) once
    failed the transformWithState tests with Py4JErrors: the session now refuses with the cause instead."""
    monkeypatch.setenv("SPARK_HOME", str(fake_spark_home(tmp_path / "other", "9.9.9")))
    refusal = rf"holds Spark 9\.9\.9, but this environment's pyspark is {re.escape(PYSPARK)}"
    with pytest.raises(LaunchFailed, match=refusal):
        local_spark("refused")
    monkeypatch.delenv("SPARK_HOME")
    versions = {"pyspark": "4.3.0", "pyspark-client": "4.2.0"}
    monkeypatch.setattr(spark_app, "_installed", versions.get)
    with pytest.raises(LaunchFailed, match=r"pyspark 4\.3\.0 and pyspark-client 4\.2\.0"):
        local_spark("refused")


def test_make_does_not_hand_a_shell_spark_home_to_the_tests_or_the_demo(tmp_path: Path) -> None:
    shown = subprocess.run(
        ["make", "-s", "--eval", 'show-spark-home: ; @echo "[$$SPARK_HOME]"', "show-spark-home"],
        cwd=REPO,
        env={**os.environ, "SPARK_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "[]"
