"""The JVM stack: jars resolved by devtools.jvm, a real Kafka broker (devtools.kafka), and Spark with the
spark-kafka, s3a and delta groups against that broker, the embedded S3 server and a local path.

Spark runs in ONE worker process of its own for this module: jars join a JVM only when it starts, and the
conftest's `spark` session may already run in this process without them (getOrCreate would hand that
session back, its JVM unable to load the Kafka source). The worker's session has all three groups, as the
demo's and the managed jobs' drivers will.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import DeploymentStatus, State
from airflow_plugin.core.sinks import delta as delta_sink
from airflow_plugin.core.storage import LocalStorage
from devtools import jvm
from devtools.embedded_s3 import EmbeddedS3
from devtools.kafka import EmbeddedKafka, KafkaError
from devtools.spark import local_spark
from spark_jobs.runtime.status import ProgressListener, StatusBoard

SPARK_GROUPS = ["spark-kafka", "s3a", "delta"]
SPARK_CALL_TIMEOUT = 240  # one action on a cold JVM, 2 busy cores


# --- devtools.jvm ---


def test_spark_groups_match_pyspark_and_repeat_none_of_its_jars() -> None:
    import pyspark

    conf = jvm.spark_conf(SPARK_GROUPS)  # refuses a jar pyspark ships, or one artifact in two versions
    names = {Path(jar).name for jar in conf["spark.jars"].split(",")}
    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in names
    assert f"spark-token-provider-kafka-0-10_2.13-{pyspark.__version__}.jar" in names
    hadoop = next(name for name in jvm.pyspark_jars() if name.startswith("hadoop-client-api-"))
    assert hadoop.replace("hadoop-client-api-", "hadoop-aws-") in names
    assert {"delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"} <= names
    assert not any(name.startswith("bundle-") for name in names)  # the 686 MB AWS SDK bundle stays out
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_resolved_group_needs_no_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    jars = jvm.classpath("kafka-broker")
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn: only the cached list can answer
    assert jvm.is_resolved("kafka-broker")
    assert jvm.classpath("kafka-broker") == jars


def _group_copy(tmp_path: Path, group: str, maven_config: str = "") -> Path:
    """A copy of a group's POM in its own directory; .mvn/maven.config adds options to Maven's command line."""
    pom_dir = tmp_path / "poms"
    (pom_dir / ".mvn").mkdir(parents=True)
    shutil.copy(jvm.POM_DIR / f"{group}.xml", pom_dir)
    (pom_dir / ".mvn" / "maven.config").write_text(maven_config)
    return pom_dir


def test_missing_maven_names_the_artifact_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pom_dir = _group_copy(tmp_path, "spark-kafka")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(jvm.JvmError, match=r"Maven \(mvn\) is not installed.*spark-sql-kafka.*apt-get install"):
        jvm.classpath("spark-kafka", pom_dir=pom_dir, cache_dir=tmp_path / "cache")


def test_unreachable_repository_names_the_artifact_and_the_fix(tmp_path: Path) -> None:
    # offline with an empty local repository: what a machine without network access meets
    pom_dir = _group_copy(tmp_path, "s3a", f"-o\n-Dmaven.repo.local={tmp_path / 'empty-repo'}\n")
    with pytest.raises(
        jvm.JvmError, match=r"could not resolve org.apache.hadoop:hadoop-aws.*offline.*Fix: check the net"
    ):
        jvm.classpath("s3a", pom_dir=pom_dir, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_jar_pyspark_ships_is_refused_with_its_exclusion(tmp_path: Path) -> None:
    jvm.classpath("kafka-broker")  # brings slf4j-api 1.7.36 into ~/.m2, and spark-kafka the rest: Maven runs offline
    jvm.classpath("spark-kafka")
    pom_dir = _group_copy(tmp_path, "spark-kafka", "-o\n")
    pom = pom_dir / "spark-kafka.xml"
    extra = "<dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>1.7.36</version>"
    pom.write_text(pom.read_text().replace("<dependencies>", f"<dependencies>{extra}</dependency>", 1))
    with pytest.raises(
        jvm.JvmError, match=r"slf4j-api \(slf4j-api-1.7.36.jar\) is already in pyspark's jars.*<exclusion>"
    ):
        jvm.classpath("spark-kafka", pom_dir=pom_dir, cache_dir=tmp_path / "cache")


def test_only_spark_groups_make_spark_conf() -> None:
    with pytest.raises(jvm.JvmError, match="'kafka-broker' is not a Spark group"):
        jvm.spark_conf(["kafka-broker"])


# --- devtools.kafka ---


def _consume(kafka: EmbeddedKafka, topic: str, partition: int, count: int) -> list[tuple[int, bytes]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "tests", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        records: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                records.append((message.offset(), message.value()))
        return records
    finally:
        consumer.close()


def test_a_topic_round_trips_records(kafka: EmbeddedKafka, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    assert kafka.produce(topic, [b"a", "b", ("key", "c")], partition=1) == [(1, 0), (1, 1), (1, 2)]
    assert _consume(kafka, topic, 1, 3) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert kafka.earliest_offsets(topic) == {0: 0, 1: 0}
    assert kafka.latest_offsets(topic) == {0: 0, 1: 3}


def test_delete_records_moves_the_earliest_offset(kafka: EmbeddedKafka, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    kafka.produce(topic, [f"r{i}" for i in range(10)])
    assert kafka.delete_records(topic, {0: 4}) == {0: 4}
    assert kafka.earliest_offsets(topic) == {0: 4}
    assert kafka.latest_offsets(topic) == {0: 10}
    assert _consume(kafka, topic, 0, 6)[0] == (4, b"r4")  # what was before offset 4 is gone for real


def test_a_broker_that_cannot_start_says_why() -> None:
    broker = EmbeddedKafka({"log.segment.bytes": "1000"})  # Kafka 4 refuses segments under 1 MiB
    with pytest.raises(KafkaError, match=r"log.segment.bytes: Value must be at least 1048576"):
        broker.start()


_BROKER_UNTIL_INTERRUPTED = """
import signal, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores SIGINT)
from devtools.kafka import EmbeddedKafka
with EmbeddedKafka() as kafka:
    print(kafka.pid, flush=True)
    threading.Event().wait()
"""


def test_ctrl_c_leaves_no_broker_behind() -> None:
    python = subprocess.Popen([sys.executable, "-c", _BROKER_UNTIL_INTERRUPTED], stdout=subprocess.PIPE, text=True)
    try:
        broker_pid = int(python.stdout.readline())  # printed once the broker answers
        python.send_signal(signal.SIGINT)
        python.wait(timeout=60)
    finally:
        python.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(broker_pid, 0)


# --- Spark with the spark-kafka, s3a and delta jars, in a worker process of its own ---

_spark: Any = None  # the worker's session


def _start_spark(conf: dict[str, str]) -> None:
    global _spark
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _spark = local_spark("jvm-stack-tests", 2, **conf)


def _in_worker(check: str, *args: Any) -> Any:
    """Runs one of this module's checks in the worker; Java errors do not pickle, so they come back as text."""
    try:
        return globals()[check](*args)
    except Exception:
        raise RuntimeError(f"{check} failed in the Spark worker:\n{traceback.format_exc()}") from None


def _stop_spark() -> None:
    _spark.stop()


@pytest.fixture(scope="module")
def spark_worker(s3_server: EmbeddedS3) -> Iterator[Callable[..., Any]]:
    conf = {
        **jvm.spark_conf(SPARK_GROUPS),
        **s3_server.s3a_conf(),
        "spark.databricks.delta.snapshotPartitions": "2",  # 50 tasks per snapshot of a 1-file table otherwise
    }
    worker = multiprocessing.get_context("spawn").Pool(1, initializer=_start_spark, initargs=(conf,))

    def call(check: str, *args: Any) -> Any:
        return worker.apply_async(_in_worker, (check, *args)).get(timeout=SPARK_CALL_TIMEOUT)

    try:
        yield call
        call("_stop_spark")
    finally:
        worker.terminate()  # also ends a worker stuck in a Spark job: its JVM exits with it (stdin closes)
        worker.join()


def _read_kafka(bootstrap: str, topic: str) -> list[tuple[int, str]]:
    df = _spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load()
    return sorted((row.offset, row.value.decode()) for row in df.select("offset", "value").collect())


def _stream_kafka(bootstrap: str, topic: str, checkpoint: str) -> int:
    reader = _spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    stream = reader.option("subscribe", topic).option("startingOffsets", "earliest").load()
    query = stream.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True)
    started = query.start()
    started.awaitTermination(SPARK_CALL_TIMEOUT / 2)
    return sum(progress["numInputRows"] for progress in started.recentProgress)


def _word_count_into_delta(bootstrap: str, topic: str, root: str, cast: bool) -> list[dict[str, Any]]:
    """A running word count of `topic` into a Delta table (complete mode), two records a batch; `cast`: a later
    release that casts the count to text after the aggregation, which Delta casts back to the table's type.
    Spark's progress of each batch."""
    from pyspark.sql import functions as F

    reader = _spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    lines = reader.option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 2).load()
    words = lines.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
    counts = words.groupBy("word").count()
    if cast:
        counts = counts.withColumn("count", F.col("count").cast("string"))
    writer = counts.writeStream.outputMode("complete").format("delta").option("checkpointLocation", f"{root}/ckpt")
    query = writer.trigger(availableNow=True).start(f"{root}/table")
    query.awaitTermination(SPARK_CALL_TIMEOUT / 2)
    return [json.loads(progress.json) for progress in query.recentProgress]


def _parquet_round_trip(path: str) -> list[int]:
    _spark.range(5).write.parquet(path)
    return sorted(row.id for row in _spark.read.parquet(path).collect())


def _delta_round_trip(path: str) -> list[int]:
    _spark.range(5).write.format("delta").save(path)
    return sorted(row.id for row in _spark.read.format("delta").load(path).collect())


# events of three files, one batch each: counts per key and minute of event time, a minute of watermark delay.
# Batch 1 emits x's window (from batch 0's state) and adds to a's; batch 2 emits a's and z's (batch 1's state)
_GATED_FILES = [
    [("x", 10), ("a", 130), ("z", 160)],
    [("a", 140), ("y", 300)],
    [("w", 1200)],
]


def _run_gated(inputs: Path, checkpoint: Path, table: str) -> None:
    from pyspark.sql import functions as F

    from spark_jobs.runtime.gate import DeltaTarget, GatedWriter, GateState

    events = _spark.readStream.schema("key string, ts timestamp").option("maxFilesPerTrigger", 1).json(str(inputs))
    counts = events.withWatermark("ts", "1 minute").groupBy(F.window("ts", "1 minute"), "key").count()
    rows = counts.select(F.col("window.end").alias("window_end"), "key", "count")
    writer = GatedWriter(
        _spark, DeltaTarget(table), GateState("window_end"), str(checkpoint), print, print, lambda _: None
    )
    query = rows.writeStream.outputMode("append").foreachBatch(writer).option("checkpointLocation", str(checkpoint))
    query.trigger(availableNow=True).start().awaitTermination(SPARK_CALL_TIMEOUT / 2)


def _feed_gated(inputs: Path, index: int) -> None:
    lines = [json.dumps({"key": key, "ts": second}) for key, second in _GATED_FILES[index]]
    (inputs / f"{index}.json").write_text("\n".join(lines) + "\n")


def _gated_replay_of_a_held_batch(root: str) -> dict[str, Any]:
    """A stateful query written through the gate runs batches 0 and 1; then its checkpoint as a restore of the
    driver's latest state after a crash between the table's commit of batch 1 and Spark's finds it: batch 1
    pending (its commit and the state it wrote gone), the table holding it. The runtime's check lets it start
    only because the gate runs a batch's plan before Delta skips its write; it replays batch 1 (state written,
    nothing written twice) and batch 2 counts on that state."""
    from airflow_plugin.core.sinks import DELTA, SinkRef
    from spark_jobs.runtime.sink import SinkAhead, check_start

    base = Path(root)
    inputs, first, restored, table = base / "in", base / "first", base / "restored", str(base / "table")
    inputs.mkdir(parents=True)
    _spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")  # one batch a file
    try:
        for index in (0, 1):
            _feed_gated(inputs, index)
        _run_gated(inputs, first, table)
        shutil.copytree(first, restored)
        for crc in restored.rglob("*.crc"):  # a restore copies no checksum files
            crc.unlink()
        (restored / "commits" / "1").unlink()
        removed = [f.unlink() or f.name for f in restored.glob("state/0/*/2.*")]  # state version 2: batch 1's
        refused = ""
        try:
            check_start(SinkRef(DELTA, table), str(restored))
        except SinkAhead as exc:
            refused = str(exc)
        check_start(SinkRef(DELTA, table), str(restored), runs_held_batches=True)
        _feed_gated(inputs, 2)
        _run_gated(inputs, restored, table)
    finally:
        _spark.conf.unset("spark.sql.streaming.noDataMicroBatches.enabled")
    rows = _spark.read.format("delta").load(table).collect()
    return {
        "rows": sorted((row.key, row["count"]) for row in rows),
        "removed": removed,
        "refused": refused,
        "commits": sorted(int(p.name) for p in (restored / "commits").iterdir() if p.name.isdigit()),
    }


def test_a_gated_query_replays_a_batch_its_table_already_holds(
    spark_worker: Callable[..., Any], tmp_path: Path
) -> None:
    result = spark_worker("_gated_replay_of_a_held_batch", str(tmp_path))
    assert result["removed"] and "logged, never committed" in result["refused"], result
    assert result["commits"] == [0, 1, 2], result
    assert result["rows"] == [("a", 2), ("x", 1), ("z", 1)], "every window once, batch 1's state counted"


def test_batches_spark_counts_no_rows_for_but_delta_holds_are_not_taken_for_skipped(
    spark_worker: Callable[..., Any], kafka: EmbeddedKafka, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A new release that casts a column after its aggregation, into the Delta table the old one made: Delta
    casts it back and writes every batch, but Spark's progress counts 0 input rows for them (it cannot match the
    plan Delta ran to its sources). The runtime's listener asks the table's log and does not call them skipped;
    the table holds each batch's counts."""
    topic = new_topic()
    kafka.produce(topic, ["a b", "a"])
    spark_worker("_word_count_into_delta", kafka.bootstrap, topic, str(tmp_path), False)
    kafka.produce(topic, ["b c", "a", "c", "c"])
    progress = spark_worker("_word_count_into_delta", kafka.bootstrap, topic, str(tmp_path), True)
    assert [p["batchId"] for p in progress] == [1, 2], progress
    assert [p["numInputRows"] for p in progress] == [0, 0], "Spark's count this test is about (pyspark 4.2, Delta)"

    deployments = Deployments(LocalStorage(tmp_path / "store"))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    listener = ProgressListener(board)
    for each in progress:
        listener.progress(each)
    status = deployments.status("j", "d")
    assert status is not None and status.unprocessed is None and status.skipping() is None, status.unprocessed
    table = LocalStorage(tmp_path / "table")
    query_id = progress[0]["id"]
    assert delta_sink.last_batch(table, query_id, None) == 2, "both batches are in the table's log"


def test_spark_reads_a_topic(
    spark_worker: Callable[..., Any], kafka: EmbeddedKafka, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    kafka.produce(topic, [f"event-{i}" for i in range(5)])
    assert spark_worker("_read_kafka", kafka.bootstrap, topic) == [(i, f"event-{i}") for i in range(5)]


def test_spark_streams_a_topic_and_checkpoints_its_offsets(
    spark_worker: Callable[..., Any], kafka: EmbeddedKafka, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic()
    kafka.produce(topic, [f"event-{i}" for i in range(7)])
    checkpoint = tmp_path / "checkpoint"
    assert spark_worker("_stream_kafka", kafka.bootstrap, topic, str(checkpoint)) == 7
    lines = (checkpoint / "offsets" / "0").read_text().splitlines()
    assert lines[0] == "v1"
    assert json.loads(lines[-1]) == {topic: {"0": 7}}  # the next offset to read: where batch 1 starts
    assert (checkpoint / "commits" / "0").exists()


def test_spark_writes_and_reads_parquet_on_s3(spark_worker: Callable[..., Any], s3_server: EmbeddedS3) -> None:
    bucket = f"jvm-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    assert spark_worker("_parquet_round_trip", f"s3a://{bucket}/table") == [0, 1, 2, 3, 4]
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket, Prefix="table/")["Contents"]]
    assert "table/_SUCCESS" in keys
    assert any(key.endswith(".parquet") for key in keys)


def test_spark_writes_and_reads_a_delta_table(spark_worker: Callable[..., Any], tmp_path: Path) -> None:
    table = tmp_path / "table"
    assert spark_worker("_delta_round_trip", str(table)) == [0, 1, 2, 3, 4]
    assert (table / "_delta_log" / "00000000000000000000.json").exists()  # Delta's log, not plain Parquet
