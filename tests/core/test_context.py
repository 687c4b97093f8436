"""context.py: one precedence for every setting (flag > environment > jobs file > default), the store
every command reads, S3 access handed to every location it opens, and the Kafka broker a job reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugin.core.errors import InvalidInput, NotFound
from airflow_plugin.core.jobs.context import KAFKA_ENV, STORE_ENV, Settings
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.sources.kafka import KAFKA_CONF, KafkaSettings
from airflow_plugin.core.storage import S3Settings, S3Storage
from tests.support.jobs import write_jobs


def test_the_store_comes_from_flag_then_environment_then_jobs_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = str(write_jobs(tmp_path))
    monkeypatch.delenv(STORE_ENV, raising=False)
    assert Settings(jobs_file=jobs).resolve().store_uri("orders") == str(tmp_path / "store")
    assert Settings(jobs_file=jobs).resolve().store_uri() == str(tmp_path / "store")  # the one its jobs share
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "from-env"))
    assert Settings(jobs_file=jobs).resolve().job("orders").store.uri == str(tmp_path / "from-env")
    flagged = Settings(jobs_file=jobs, store=str(tmp_path / "from-flag")).resolve()
    assert flagged.job("orders").store.uri == str(tmp_path / "from-flag")
    assert flagged.job("orders").spec.store == str(tmp_path / "store")  # the jobs file is read, not changed


def test_the_jobs_file_comes_from_flag_then_environment_then_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = write_jobs(tmp_path / "a"), write_jobs(tmp_path / "b")
    monkeypatch.chdir(tmp_path / "a")
    monkeypatch.delenv(JOBS_ENV, raising=False)
    assert Settings().resolve().jobs_path == a
    monkeypatch.setenv(JOBS_ENV, str(b))
    assert Settings().resolve().jobs_path == b
    assert Settings(jobs_file=str(a)).resolve().jobs_path == a


def test_no_store_anywhere_is_an_error_naming_the_three_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)
    monkeypatch.delenv(JOBS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # no jobs.toml here
    with pytest.raises(InvalidInput, match=r"pass --store URI, set SAVEPOINTS_STORE, or declare `store`"):
        Settings().resolve().store()
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(write_jobs(tmp_path).read_text().replace('store = "store"', ""))
    with pytest.raises(InvalidInput, match="no snapshot store"):
        Settings().resolve().job("orders")
    with pytest.raises(NotFound, match=r"unknown job 'payments'.*declared jobs are orders"):
        Settings(store=str(tmp_path)).resolve().job("payments")


def test_jobs_with_different_stores_need_a_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)
    jobs = write_jobs(tmp_path, extra='[jobs.billing]\nstore = "other"\nversions.v1 = { application = "b.py" }')
    context = Settings(jobs_file=str(jobs)).resolve()
    assert context.store_uri("billing") == str(tmp_path / "other")
    with pytest.raises(InvalidInput, match="use 2 stores"):
        context.store_uri()


def test_s3_access_reaches_the_store_and_every_location_the_job_opens(tmp_path: Path) -> None:
    access = S3Settings(endpoint_url="http://127.0.0.1:9", access_key_id="AKID", secret_access_key="secret")
    jobs = write_jobs(tmp_path).read_text().replace('store = "store"', 'store = "s3://bucket-a/store"')
    (tmp_path / "jobs.toml").write_text(jobs)
    job = Settings(jobs_file=str(tmp_path / "jobs.toml"), s3=access).resolve().job("orders")
    checkpoint = job.open("s3a://bucket-b/checkpoints/orders")
    assert isinstance(job.store.storage, S3Storage) and job.store.storage.settings is access
    assert isinstance(checkpoint, S3Storage) and checkpoint.settings is access
    assert job.child_env()["AWS_SECRET_ACCESS_KEY"] == "secret" and "secret" not in repr(job.settings)


def test_the_kafka_broker_comes_from_flag_then_environment_then_jobs_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KAFKA_ENV, raising=False)
    table = 'kafka = { bootstrap_servers = "file:9092", config = { "security.protocol" = "SSL" }, timeout = 4 }'
    jobs = str(write_jobs(tmp_path, extra=f"[jobs.reads_kafka]\n{table}\nversions.v1 = {{ application = 'k.py' }}"))
    declared = Settings(jobs_file=jobs).resolve()
    assert declared.job("orders").kafka is None  # a job without a kafka table reads no broker
    assert declared.job("reads_kafka").kafka == KafkaSettings("file:9092", {"security.protocol": "SSL"}, 4.0)
    monkeypatch.setenv(KAFKA_ENV, "env:9092")
    assert declared.kafka("orders") is None, "the environment is read once, when the settings are resolved"
    environment = Settings(jobs_file=jobs).resolve()
    assert environment.kafka("reads_kafka") == KafkaSettings("env:9092", {"security.protocol": "SSL"}, 4.0)
    assert environment.kafka("orders") == KafkaSettings("env:9092")
    flagged = Settings(jobs_file=jobs, kafka=KafkaSettings("flag:9092")).resolve().job("reads_kafka")
    assert flagged.kafka == KafkaSettings("flag:9092", {"security.protocol": "SSL"}, 10.0)
    # the job's driver reads the broker checked: in its environment and its conf, never among the job's arguments
    assert flagged.child_env()[KAFKA_ENV] == "flag:9092" and flagged.child_conf() == {KAFKA_CONF: "flag:9092"}
    without = Settings(jobs_file=jobs).resolve().job("orders")
    assert KAFKA_ENV not in without.child_env() and without.child_conf() == {}  # it declares no kafka
    with pytest.raises(InvalidInput, match=r"\[jobs.bad\] kafka needs bootstrap_servers"):
        write_jobs(tmp_path, extra="[jobs.bad]\nkafka = { }\nversions.v1 = { application = 'b.py' }")
        Settings(jobs_file=jobs).resolve().jobs  # noqa: B018
