"""The launcher's spark-submit command from a Spark connection in the provider's forms (hooks/spark_submit.py)."""

from __future__ import annotations

import json

import pytest

from airflow_plugin.core.jobs.launcher import SubmitSpec
from airflow_plugin.hooks.spark_submit import connection_command_builder

SPEC = SubmitSpec(
    application="/jobs/v1.py",
    app_args=["--job", "orders"],
    name="orders-v1",
    conf={"spark.sql.shuffle.partitions": "3"},
)


def _command(monkeypatch: pytest.MonkeyPatch, connection: dict[str, object]) -> list[str]:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps(connection))
    return connection_command_builder("spark_test")(SPEC)


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_master_deploy_mode_and_queue_come_from_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    command = _command(
        monkeypatch, {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster", "queue": "streaming"}}
    )
    assert _option(command, "--master") == "yarn" and _option(command, "--deploy-mode") == "cluster"
    assert "spark.yarn.submit.waitAppCompletion=false" in command  # YARN's own detach switch
    assert "spark.yarn.queue=streaming" in command and "spark.sql.shuffle.partitions=3" in command
    assert command[-3:] == ["/jobs/v1.py", "--job", "orders"]


@pytest.mark.parametrize(
    ("connection", "master"),
    [
        ({"conn_type": "spark", "host": "local[3]"}, "local[3]"),  # the UI form: the whole master in host
        ({"conn_type": "spark", "host": "k8s://https://api.example:6443"}, "k8s://https://api.example:6443"),
        ({"conn_type": "spark", "host": "master.example", "port": 7077}, "spark://master.example:7077"),
    ],
)
def test_masters_in_every_connection_form(
    monkeypatch: pytest.MonkeyPatch, connection: dict[str, object], master: str
) -> None:
    command = _command(monkeypatch, connection)
    assert _option(command, "--master") == master
    assert _option(command, "--deploy-mode") == "client"  # the jobs file's, when the connection names none
    assert not any("waitAppCompletion" in part for part in command)


def test_a_kubernetes_namespace_and_an_unknown_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    command = _command(
        monkeypatch, {"conn_type": "spark", "host": "k8s://https://api:443", "extra": {"namespace": "streams"}}
    )
    assert "spark.kubernetes.namespace=streams" in command
    from airflow_plugin.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="spark-binary 'rm' is not one of spark-submit"):
        _command(monkeypatch, {"conn_type": "spark", "host": "yarn", "extra": {"spark-binary": "rm"}})
