"""sources/: positions parsed by the offset log's version, the pure comparison with what a broker holds, the
broker itself (the session's real KRaft broker, topics per test), and the source guard every restore goes
through, on a synthetic checkpoint whose Kafka offsets the broker really deleted (delete_records moves the
log start, as retention does). The same with real Spark queries: tests/e2e/test_kafka_e2e.py."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.errors import BrokerUnavailable, CheckpointError, SourceGap
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.sources import offsets_by_source, positions
from airflow_plugin.core.sources.kafka import (
    KAFKA_CONF,
    KAFKA_ENV,
    Broker,
    KafkaSettings,
    PartitionState,
    compare,
    kafka_positions,
)
from airflow_plugin.core.sources.subscription import Subscription, topic_changes
from airflow_plugin.core.storage import open_storage
from devtools.kafka import EmbeddedKafka
from tests.support.jobs import write_jobs
from tests.support.synthetic import add_batch, kafka_offsets, tree, write_checkpoint

KAFKA_LINE = '{"events":{"0":42,"1":40}}'


def test_positions_follow_the_offset_logs_version() -> None:
    v1 = positions(1, [KAFKA_LINE, '{"logOffset":7}', "13", "-"])
    assert [(p.source, p.kind) for p in v1] == [("0", "kafka"), ("1", "file"), ("2", "rate")]
    assert v1[0].offset == {"events": {"0": 42, "1": 40}}
    v2 = positions(2, ["1:" + KAFKA_LINE, '0:{"logOffset":7}', "2:-"])
    assert [(p.source, p.kind) for p in v2] == [("1", "kafka"), ("0", "file")]
    assert offsets_by_source(2, ["orders:13"]) == {"orders": "13"}  # named sources keep their name
    with pytest.raises(CheckpointError, match="is not '<source id>:<offset>'"):
        positions(2, [KAFKA_LINE])  # a v1 line in a v2 log: never read by position


def test_compare_names_every_kind_of_gap() -> None:
    snapshot = kafka_positions(1, ['{"a":{"0":10,"1":5,"2":9},"gone":{"0":3}}'])
    held = {"a": {0: (12, 20), 1: (0, 5), 3: (4, 4), 4: (0, 2)}, "gone": None}
    check = compare(snapshot, held, "broker:9092")
    states = {(p.topic, p.partition): (p.state, p.lost) for p in check.partitions}
    assert states == {
        ("a", 0): (PartitionState.EXPIRED, 2),
        ("a", 1): (PartitionState.OK, 0),
        ("a", 2): (PartitionState.GONE, None),
        ("a", 3): (PartitionState.ADDED, 4),  # created after the snapshot, its first 4 records deleted
        ("a", 4): (PartitionState.ADDED, 0),  # from 0: nothing lost, no problem
        ("gone", 0): (PartitionState.GONE, None),
    }
    assert not check.restorable and check.records_lost == 6 and check.lost_unknown
    assert check.summary() == "6 records and more gone from Kafka (a-0, a-2, a-3, gone-0)"
    beyond = compare(kafka_positions(1, ['{"a":{"0":30}}']), {"a": {0: (0, 20)}})
    assert [p.state for p in beyond.partitions] == [PartitionState.BEYOND_END]
    assert "deleted and recreated" in beyond.partitions[0].describe()
    assert compare(kafka_positions(1, ['{"a":{"0":12}}']), {"a": {0: (12, 20)}}).restorable
    grown = compare(kafka_positions(1, ['{"a":{"0":12}}']), {"a": {0: (12, 20), 1: (0, 3)}})
    assert grown.restorable and grown.summary().endswith("(added since, read from offset 0: a-1)")


def test_the_broker_reports_earliest_and_latest_offsets(kafka: EmbeddedKafka, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    kafka.produce(topic, [f"r{i}" for i in range(5)], partition=0)
    kafka.delete_records(topic, {0: 2})
    marks = Broker(KafkaSettings(kafka.bootstrap)).watermarks([topic, "no-such-topic"])
    assert marks == {topic: {0: (2, 5), 1: (0, 0)}, "no-such-topic": None}


def test_an_unreachable_broker_names_its_address() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"  # nothing listens there
    with pytest.raises(BrokerUnavailable, match=rf"Kafka broker {address} did not answer within 2s.*nothing was"):
        Broker(KafkaSettings(address, timeout_s=2)).watermarks(["events"])
    secret = KafkaSettings(address, {"sasl.password": "hunter2", "security.protocol": "SASL_SSL"})
    assert "hunter2" not in repr(secret) and "SASL_SSL" in repr(secret)


def _kafka_snapshots(tmp_path: Path, topic: str, offsets: list[dict[int, int]]) -> tuple[str, list[str]]:
    """A synthetic checkpoint of a query reading `topic`, snapshotted once per entry of `offsets` (a new batch each)."""
    store_uri, ckpt = str(tmp_path / "store"), write_checkpoint(tmp_path / "ckpt", batches=1)
    store, ids = SnapshotStore(open_storage(store_uri)), []
    for batch, next_offsets in enumerate(offsets):
        if batch:
            add_batch(ckpt, batch)
        kafka_offsets(ckpt, batch, {topic: next_offsets}, version=2)
        ids.append(create_snapshot(store, open_storage(str(ckpt)), SnapshotRequest(job="orders")).id)
    return store_uri, ids


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_restore_behind_the_brokers_retention_is_refused_and_an_accepted_gap_is_recorded(
    kafka: EmbeddedKafka, new_topic: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=2)
    kafka.produce(topic, [f"r{i}" for i in range(10)], partition=0)
    kafka.produce(topic, [f"r{i}" for i in range(4)], partition=1)
    store, (old, newer) = _kafka_snapshots(tmp_path, topic, [{0: 3, 1: 1}, {0: 8, 1: 4}])
    kafka.delete_records(topic, {0: 6, 1: 2})  # retention: the records the old snapshot reads next are gone
    common = ("--store", store, "--kafka-bootstrap", kafka.bootstrap)
    target = tmp_path / "restored"

    code, _, err = cli(capsys, "restore", "orders", old, "--to", str(target), *common)
    assert code == 4 and not target.exists()
    flat = " ".join(err.split())
    assert f"{topic}-0: the snapshot resumes at offset 3, but the broker's earliest offset is 6: 3 records are" in flat
    assert f"{topic}-1: the snapshot resumes at offset 1" in flat and "4 records gone from Kafka" in flat
    assert f"Restore a newer snapshot instead: {newer}" in flat and "--accept-source-gap" in flat

    code, out, _ = cli(capsys, "list", "orders", *common, "--json")
    rows = {row["id"]: row for row in json.loads(out)}
    assert code == 0 and rows[old]["source_check"]["records_lost"] == 4 and not rows[old]["source_check"]["restorable"]
    assert rows[newer]["source_check"]["restorable"] and rows[newer]["source_positions"][0]["kind"] == "kafka"
    code, out, _ = cli(capsys, "list", "orders", *common)
    assert "GONE: 4 records" in out
    code, out, _ = cli(capsys, "prune", "orders", "--dry-run", *common, "--json")
    marked = json.loads(out)["plan"]["unrestorable"]
    assert [(m["snapshot"], m["records_lost"]) for m in marked] == [(old, 4)]

    code, out, err = cli(capsys, "restore", "orders", old, "--to", str(target), *common, "--accept-source-gap")
    assert code == 0 and (target / "commits/0").exists() and "source gap accepted" in err
    code, out, _ = cli(capsys, "show", "orders", old, *common, "--json")
    [event] = json.loads(out)["history"]
    assert event["event"] == "restored-with-source-gap" and event["records_lost"] == 4
    assert event["target"] == str(target)


def test_without_a_broker_a_kafka_snapshot_is_refused_unless_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SAVEPOINTS_KAFKA_BOOTSTRAP", raising=False)
    store_uri, (snapshot,) = _kafka_snapshots(tmp_path, "events", [{0: 3}])
    store, target = SnapshotStore(open_storage(store_uri)), open_storage(str(tmp_path / "restored"))
    with pytest.raises(SourceGap, match="whose offsets cannot be checked: no Kafka broker is known for job orders"):
        plan_restore(store, "orders", snapshot, target)
    plan = plan_restore(store, "orders", snapshot, target, accept_source_gap=True)
    before = tree(tmp_path / "store")
    assert plan.source_gap is not None and not plan.source_gap["checked"]
    assert tree(tmp_path / "store") == before  # planning records nothing; restoring does
    execute_restore(store, plan)
    assert [e["checked"] for e in store.get("orders", snapshot).history] == [False]


def test_a_new_subscription_is_compared_with_the_snapshots_topics(
    kafka: EmbeddedKafka, new_topic: Callable[..., str]
) -> None:
    held, fresh, trimmed = new_topic(), new_topic(), new_topic(partitions=2)
    kafka.produce(trimmed, ["a", "b"], partition=1)
    kafka.delete_records(trimmed, {1: 1})
    snapshot = kafka_positions(1, [json.dumps({held: {"0": 0}, "dropped": {"0": 5}})])
    assert Subscription.parse(f"KafkaV2[Subscribe[{held}, x]]") == Subscription("Subscribe", f"{held}, x")
    assert Subscription.parse("KafkaV2[SubscribePattern[ord.*]]").reads("orders")  # Spark's find, not a match
    assert Subscription.parse("KafkaV2[Assign[a-b-0, a-b-1]]").topics == {"a-b"}
    assert Subscription.parse("FileStreamSource[file:/in]") is None
    changes = topic_changes(
        snapshot, [f"KafkaV2[Subscribe[{held}, {fresh}, {trimmed}]]"], Broker(KafkaSettings(kafka.bootstrap))
    )
    found = {c.topic: (c.change, c.problem) for c in changes}
    assert found == {"dropped": ("dropped", True), fresh: ("added", False), trimmed: ("added", True)}
    detail = next(c.describe() for c in changes if c.topic == trimmed)
    assert f"{trimmed}-1 from 1" in detail and "ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO" in detail


def test_deploy_refuses_an_expired_savepoint_and_records_an_accepted_gap_in_the_deployment(
    kafka: EmbeddedKafka, new_topic: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic()
    kafka.produce(topic, [f"r{i}" for i in range(8)])
    _, (snapshot,) = _kafka_snapshots(tmp_path, topic, [{0: 3}])
    kafka.delete_records(topic, {0: 5})
    # stands in for the job: keeps the arguments and the broker it was given, then fails. In a file, not printed:
    # spark-submit copies a Python driver's output in a thread it does not wait for, so the last lines can miss its log
    app, seen = tmp_path / "job.py", tmp_path / "job-args.txt"
    app.write_text(
        "import os, sys, pathlib\n"
        f"given = ' '.join(sys.argv[1:]) + '\\n' + os.environ.get({KAFKA_ENV!r}, '')\n"
        f"pathlib.Path({str(seen)!r}).write_text(given)\nsys.exit(3)\n"
    )
    table = f'kafka = {{ bootstrap_servers = "{kafka.bootstrap}" }}'
    jobs = str(write_jobs(tmp_path, application=str(app), extra=table))

    code, _, err = cli(capsys, "deploy", "orders", "--jobs", jobs, "--restore", snapshot)
    assert code == 4 and "2 records are gone" in err and not (tmp_path / "checkpoints").exists()
    assert cli(capsys, "status", "orders", "--jobs", jobs, "--json")[1].strip() == "[]"  # nothing deployed

    code, _, err = cli(capsys, "deploy", "orders", "--jobs", jobs, "--restore", snapshot, "--accept-source-gap")
    assert code == 9 and "spark-submit exited with code 3" in err  # restored, launched, failed
    args, given = seen.read_text().split("\n")
    assert given == kafka.bootstrap and "--kafka-bootstrap-servers" not in args, "the broker, not an argument"
    [deployment] = Deployments(open_storage(str(tmp_path / "store"))).list("orders")
    assert f"{KAFKA_CONF}={kafka.bootstrap}" in deployment.launcher["command"]  # a cluster's driver gets the conf
    [row] = json.loads(cli(capsys, "status", "orders", "--jobs", jobs, "--json")[1])
    assert row["restored_from"] == snapshot and row["source_gap"] == f"2 records gone from Kafka ({topic}-0)"
    [event] = SnapshotStore(open_storage(str(tmp_path / "store"))).get("orders", snapshot).history
    assert event["records_lost"] == 2 and event["target"] == row["checkpoint"]


def test_without_the_kafka_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka.admin", None)  # as if the kafka extra were not installed
    with pytest.raises(BrokerUnavailable, match=r"needs the confluent-kafka package.*spark-savepoints\[kafka\]"):
        Broker(KafkaSettings("127.0.0.1:9")).watermarks(["events"])
