"""What the versions of the windowed job share.

Input: JSON events `{"user", "country", "event_time", "seq"}`, from one of two sources (job arguments):
  - files in a directory (`--input DIR`; spark_jobs.generate writes them), or
  - the values of a Kafka topic (`--topic NAME`; its broker the one the engine hands the driver from the jobs
    file's `kafka` table, spark_jobs/runtime/broker.py, or `--kafka-bootstrap-servers HOST:PORT`;
    devtools/kafka_job.py produces them, key = user), read with
    `failOnDataLoss=true` (a restored query whose offsets Kafka no longer holds fails rather than skipping:
    the engine refuses such a restore before it starts, core/sources) and `maxOffsetsPerTrigger`. A producer
    that retries writes a record twice: duplicates are dropped by `seq` within the watermark, a first
    stateful operator (Kafka only).
Query: a one-minute tumbling event-time window per key with a one-minute watermark, counted, in
APPEND mode into the FILE sink (JSON lines), or with `--sink delta` into a Delta table. Append mode emits
each (key, window) exactly once, when the watermark passes the window's end; the file sink logs committed
batch ids in `<output>/_spark_metadata`, Delta (query id, batch id) in each table commit, and both skip a
replayed batch: exactly-once end to end. So a final output that is complete (after the
generator's flush marker) holds every event once: the sum of `events` equals the events fed and no
(key, window) appears twice (output.py checks both).

State: RocksDB with changelog checkpointing. The job sets both confs itself unless spark-submit passed
them (`--conf` wins), because changelog checkpointing is not pinned in the checkpoint (docs/spark-checkpoints.md
section 1): every version must carry it, and the job code is the one place all versions share.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from spark_jobs.runtime import InitialState, SinkKind, SourceKind, StreamingJob, kafka_bootstrap_servers

EVENT_SCHEMA = StructType(
    [
        StructField("user", StringType()),
        StructField("country", StringType()),
        StructField("event_time", TimestampType()),
        StructField("seq", LongType()),
    ]
)
WINDOW = "1 minute"
WATERMARK_DELAY = "1 minute"
# how far behind the newest event time the state reaches: an open window (WINDOW) held for WATERMARK_DELAY
STATE_HORIZON = "2 minutes"

JOB_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.session.timeZone": "UTC",  # window bounds in the output read as UTC
}


@dataclass(frozen=True)
class KafkaInput:
    bootstrap_servers: str
    topic: str
    max_offsets_per_trigger: int | None


@dataclass(frozen=True)
class JobArgs:
    input: str | None  # a directory of event files, or None: `kafka`
    output: str
    max_files_per_trigger: int | None
    kafka: KafkaInput | None = None
    sink: SinkKind = SinkKind.FILE

    @property
    def source(self) -> SourceKind:
        return SourceKind.KAFKA if self.kafka else SourceKind.FILE


def parse_job_args(argv: list[str]) -> JobArgs:
    """`(--input DIR | --topic NAME [--kafka-bootstrap-servers HOST:PORT]) --output DIR` and the source's rate
    limit (the jobs file passes them). A topic's broker is the one the engine hands the driver (the jobs file's
    `kafka` table: spark_jobs/runtime/broker.py) unless the arguments name one."""
    parser = argparse.ArgumentParser(prog="windowed job", allow_abbrev=False)
    parser.add_argument("--input", help="directory of JSON event files")
    parser.add_argument("--topic", help="a Kafka topic of JSON events, instead of --input")
    parser.add_argument("--kafka-bootstrap-servers", help="the topic's broker (default: the jobs file's kafka)")
    parser.add_argument("--output", required=True, help="file sink directory (JSON lines), or the Delta table")
    parser.add_argument("--sink", choices=[SinkKind.FILE, SinkKind.DELTA], default=SinkKind.FILE, help="default: file")
    parser.add_argument(
        "--max-files-per-trigger", type=int, default=1, help="files per batch; 0 = all available (default 1)"
    )
    parser.add_argument("--max-offsets-per-trigger", type=int, default=1000, help="Kafka records per batch; 0 = all")
    args = parser.parse_args(argv)
    if bool(args.input) == bool(args.topic):
        parser.error("give one source: --input DIR or --topic NAME")
    kafka = None
    if args.topic:
        broker = args.kafka_bootstrap_servers or kafka_bootstrap_servers()
        if not broker:
            parser.error("--topic needs a broker: declare kafka in the jobs file, or pass --kafka-bootstrap-servers")
        kafka = KafkaInput(broker, args.topic, args.max_offsets_per_trigger or None)
    return JobArgs(args.input, args.output, args.max_files_per_trigger or None, kafka, SinkKind(args.sink))


def apply_job_conf(spark: SparkSession) -> None:
    """Set the job's confs unless spark-submit set them (SQL confs: they apply to queries started later)."""
    submitted = spark.sparkContext.getConf()
    for key, value in JOB_CONF.items():
        if not submitted.contains(key):
            spark.conf.set(key, value)


def raw_events(spark: SparkSession, args: JobArgs) -> DataFrame:
    """The event stream as read: `--max-files-per-trigger` files, or `--max-offsets-per-trigger` records a batch."""
    if args.kafka is not None:
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", args.kafka.bootstrap_servers)
            .option("subscribe", args.kafka.topic)
            .option("startingOffsets", "earliest")  # a fresh deployment reads the topic from its start
            .option("failOnDataLoss", "true")
        )
        if args.kafka.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", args.kafka.max_offsets_per_trigger)
        value = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event")
        return reader.load().select(value).select("event.*")
    reader = spark.readStream.schema(EVENT_SCHEMA)
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    return reader.json(args.input)


def events(spark: SparkSession, args: JobArgs) -> DataFrame:
    """The event stream with its watermark; from Kafka each `seq` once (a retried record counts once)."""
    stream = raw_events(spark, args).withWatermark("event_time", WATERMARK_DELAY)
    return stream.dropDuplicatesWithinWatermark(["seq"]) if args.kafka is not None else stream


def window_counts(stream: DataFrame, keys: list[str]) -> DataFrame:
    """Events per (keys, one-minute window): the stateful operator. Its grouping keys are the state key."""
    return stream.groupBy(F.window("event_time", WINDOW), *keys).agg(F.count(F.lit(1)).alias("events"))


def output_columns(counts: DataFrame, keys: list[str], version: str, *extra: Column) -> DataFrame:
    """Flatten the window and tag each row with the version that emitted it (after the aggregation:
    changing these columns never touches state)."""
    return counts.select(
        *keys,
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "events",
        F.lit(version).alias("version"),
        *extra,
    )


def sink(
    result: DataFrame, args: JobArgs, *, state_horizon: str | None = None, initial_state: InitialState | None = None
) -> StreamingJob:
    """Append mode into the file sink or a Delta table: exactly-once, declared so (with the source) for the
    runtime. Into Delta the job names its gate column, the window's end: the runtime then writes its batches
    itself, and a blue/green upgrade can split the windows between two versions at a time T."""
    if args.sink is SinkKind.DELTA:  # a new version may add a column (v2's): the table's schema grows
        writer = result.writeStream.format("delta").option("mergeSchema", "true")
    else:
        writer = result.writeStream.format("json")
    writer = writer.outputMode("append").option("path", args.output)
    gate = "window_end" if args.sink is SinkKind.DELTA else None
    return StreamingJob(
        writer,
        sink=args.sink,
        source=args.source,
        gate_column=gate,
        state_horizon=state_horizon,
        initial_state=initial_state,
    )


def counts_job(
    spark: SparkSession, job_args: list[str], keys: list[str], version: str, *extra: Column, where: Column | None = None
) -> StreamingJob:
    """One version of the job: events (filtered by `where`) counted per keys and minute, tagged with the
    version, into the sink. What the versions differ in is exactly what these arguments say."""
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    stream = events(spark, args)
    if where is not None:
        stream = stream.where(where)
    return sink(output_columns(window_counts(stream, keys), keys, version, *extra), args, state_horizon=STATE_HORIZON)
