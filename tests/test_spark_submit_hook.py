"""The launcher's spark-submit command built by the Spark provider's SparkSubmitHook from a connection."""

from __future__ import annotations

import json

import pytest

from airflow_plugin.core.jobs.launcher import SubmitSpec


def test_command_comes_from_the_spark_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_plugin.hooks.spark_submit import hook_command_builder

    connection = {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster", "queue": "streaming"}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps(connection))
    spec = SubmitSpec(
        application="/jobs/v1.py",
        app_args=["--job", "orders"],
        name="orders-v1",
        conf={"spark.sql.shuffle.partitions": "3"},
    )
    command = hook_command_builder("spark_test")(spec)
    assert command[command.index("--master") + 1] == "yarn"
    assert command[command.index("--deploy-mode") + 1] == "cluster"
    assert "spark.yarn.submit.waitAppCompletion=false" in command  # YARN's own detach switch
    assert "spark.sql.shuffle.partitions=3" in command and "streaming" in command
    assert command[-3:] == ["/jobs/v1.py", "--job", "orders"]


def test_local_master_from_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_plugin.hooks.spark_submit import hook_command_builder

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[3]"}))
    command = hook_command_builder("spark_local")(SubmitSpec(application="app.py", app_args=[]))
    assert command[command.index("--master") + 1] == "local[3]"
    assert not any("waitAppCompletion" in part for part in command)
