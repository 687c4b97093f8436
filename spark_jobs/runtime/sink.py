"""The sink guard at the start of a query: before the runtime starts a query, it reads which sink the query
will write and refuses to start it when that sink already holds batches the query would run (the engine's
rule: airflow_plugin/core/guards/sink.py). This is the one check every start passes through (a fresh deploy,
a restore, an upgrade's cutover and rollback), and it sees the sink the version's code really writes, not
the one an earlier deployment reported.

Which sink: PySpark's DataStreamWriter keeps its format and options in the JVM object it wraps, in private
fields of Spark Classic's `org.apache.spark.sql.classic.DataStreamWriter` (`source`, `extraOptions`); they are
read by reflection, which Spark 4.2 (the version this project pins) allows. Anything else (a foreachBatch, a
Kafka or console sink, a writer whose fields cannot be read) is not guarded here, and says so in the log.

The same fields give the query itself (`ds`), its output mode and its Delta options: `gated_query` hands them
to the gate (gate.py), which writes a blue/green-capable job's batches itself."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_plugin.core.guards.sink import FRESH_START, SINK_AHEAD, ahead, rewind_of_fresh_start, start_bound
from airflow_plugin.core.sinks import DELTA, FILE, SinkRef
from airflow_plugin.core.snapshots.checkpoint import read_position
from airflow_plugin.core.storage import open_storage

from .gate import DeltaTarget

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from .delivery import StreamingJob

log = logging.getLogger(__name__)

# Spark's file-based formats: a query writing one of them to a path uses the file sink (FileStreamSink)
FILE_FORMATS = frozenset({"json", "parquet", "csv", "orc", "text", "avro"})


class SinkAhead(Exception):
    """The sink already holds batches the query would run: it was not started."""

    error_class = SINK_AHEAD


def _field(writer: Any, name: str) -> Any:
    declared = writer.getClass().getDeclaredField(name)
    declared.setAccessible(True)
    return declared.get(writer)


def sink_of(writer: DataStreamWriter, spark: SparkSession) -> SinkRef | None:
    """The file sink or Delta table a writer will write, its path qualified as Spark qualifies it (a relative
    path against the driver's working directory: `file:/...`); None for any other sink."""
    try:
        jwriter = writer._jwrite  # type: ignore[attr-defined]
        source = str(_field(jwriter, "source") or "").lower()
        path_option = _field(jwriter, "extraOptions").get("path")
        path = str(path_option.get()) if path_option.isDefined() else None
    except Exception as exc:  # another Spark, or Spark Connect: no JVM writer to read
        log.warning("the sink guard cannot read this writer's sink (%s): the query starts unchecked", exc)
        return None
    kind = FILE if source in FILE_FORMATS else DELTA if source == "delta" else None
    if kind is None or not path:
        return None
    return SinkRef(kind, _qualified(path, spark))


def query_of(writer: DataStreamWriter, spark: SparkSession) -> DataFrame | None:
    """The query a writer will start (its `ds`), None where the JVM writer cannot be read."""
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

    try:
        return ClassicDataFrame(_field(writer._jwrite, "ds"), spark)  # type: ignore[attr-defined]
    except Exception as exc:  # another Spark, or Spark Connect
        log.warning("the query of this writer cannot be read (%s)", exc)
        return None


def gated_query(job: StreamingJob, spark: SparkSession) -> tuple[DataFrame, DeltaTarget] | str:
    """The query and its Delta table, for the runtime to write through the gate (gate.py); or why the job's
    writes cannot be gated: it names no gate column, or it does not append to a Delta table."""
    sink = sink_of(job.writer, spark)
    if sink is None or sink.kind != DELTA:
        what = sink.description if sink else "neither a file sink nor a Delta table"
        one_writer = " (its log takes one writer)" if sink is not None and sink.kind == FILE else ""
        return f"its sink is {what}{one_writer}, not a Delta table"
    if not job.gate_column:
        return "the job names no gate column (StreamingJob(..., gate_column=...))"
    jwriter = job.writer._jwrite  # type: ignore[attr-defined]
    mode = str(_field(jwriter, "outputMode").toString()).lower()
    if mode != "append":
        return f"its output mode is {mode}: a window is written once only in append mode"
    options = {str(k): str(v) for k, v in _scala_map(_field(jwriter, "extraOptions")).items()}
    options = {k: v for k, v in options.items() if k.lower() not in ("path", "checkpointlocation")}
    query = query_of(job.writer, spark)
    if query is None:
        return "its query cannot be read from its writer"
    if job.gate_column not in query.columns:
        return f"its output has no column {job.gate_column!r} (columns: {', '.join(query.columns)})"
    return query, DeltaTarget(sink.location, options)


def _scala_map(scala_map: Any) -> dict[Any, Any]:
    """A Scala Map's entries (py4j hands over the JVM object)."""
    entries, iterator = {}, scala_map.iterator()
    while iterator.hasNext():
        entry = iterator.next()
        entries[entry._1()] = entry._2()
    return entries


def _qualified(path: str, spark: SparkSession) -> str:
    """`s3a://...` as given; a path without a scheme as Hadoop qualifies it (`file:/abs/path`)."""
    if "://" in path:
        return path
    jvm: Any = spark._jvm  # type: ignore[attr-defined]
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[attr-defined]
    return str(hadoop_path.getFileSystem(conf).makeQualified(hadoop_path).toString())


def check_start(sink: SinkRef, checkpoint: str, *, runs_held_batches: bool = False) -> None:
    """Raise SinkAhead when `sink` holds batches that a query starting on `checkpoint` would run.
    `runs_held_batches`: the writer runs each batch's plan before its idempotent write (gate.py), so a pending
    batch the sink already holds still writes its state: it may be replayed, as a stateless query's may."""
    position = read_position(open_storage(checkpoint))
    storage = open_storage(sink.location)
    bound = -1
    if position is not None:
        stateful = position.stateful and not runs_held_batches
        bound = start_bound(position.last_committed, position.pending, stateful)
    found = ahead(sink, storage, bound, *((position.query_id, position.planned_ms(bound)) if position else ()))
    if found is None:
        return
    if position is None:
        start, rewind = FRESH_START, rewind_of_fresh_start(sink, storage)
    elif position.stateful and position.pending is not None and found.skipped == str(position.pending):
        # the driver died after the sink took its batch and before Spark recorded it (a writer that is not gated:
        # Delta's own sink skips the batch without running it): a restore of this checkpoint, even with a rewind
        # to its own sink position, still finds that batch held; an earlier snapshot can
        start = f"at batch {position.pending} (logged, never committed: its driver died after the sink took it)"
        rewind = (
            f"restore the newest snapshot from before batch {position.pending} with --rewind-sink (`savepoints list "
            "JOB`): the sink goes back to it and every later batch runs again from the same source positions"
        )
    else:
        start = f"at batch {position.next_batch}"
        rewind = "rewinding belongs to the restore that made this checkpoint: restore again with --rewind-sink"
    raise SinkAhead(found.refusal(start, position.stateful if position else False, rewind))
