"""An ordinary PySpark streaming script, run as it is under the runtime (docs/writing-a-job.md, "Bring your
script as it is"). The script runs in a thread of the driver (runpy, as `python script.py ARGS` would run it);
the runtime takes over at the moment it starts its query: `DataStreamWriter.start` and `toTable` are patched
for the script's whole run, and the patched call

  - recognises the source (the leaves of the query's logical plan) and the sink (the writer's format; a
    foreachBatch the version declares idempotent, `foreach_batch = "idempotent"` in the jobs file, as
    SinkKind.IDEMPOTENT_FOREACH_BATCH), and checks the deployment's delivery guarantee against them (delivery.py),
    then the sink guard (sink.py);
  - sets the deployment's checkpoint location, the job's query name and the jobs file's trigger: what the
    script set for these is replaced, and a replaced checkpoint location or trigger is a warning in the status;
  - starts the query and hands it back: the main thread supervises it as it supervises a built job (heartbeat,
    control channel, stop at a batch boundary), and the script's `awaitTermination()` returns when it stops.

Refused, with the deployment FAILED and nothing left running (exit EXIT_SCRIPT_REFUSED): a script that starts a
second query (the first is stopped), none within the start timeout, or ends or fails before starting one. In a
pre-flight (`--preflight`) the patched call runs the runtime's noop probe on the script's writer instead.

The script's argv is the jobs file's arguments and nothing else: the broker of a job that declares `kafka` is in the
driver's environment ($SAVEPOINTS_KAFKA_BOOTSTRAP, set from the driver's conf before the script runs: broker.py).
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_plugin.core.jobs.spec import IDEMPOTENT
from airflow_plugin.core.records.deployment import State

from .args import RuntimeArgs, Trigger, parse_args, seconds_option
from .broker import export_broker
from .delivery import DeliveryPlan, DeliveryRefused, SinkKind, SourceKind, StreamingJob, plan
from .runner import DRAIN, EXIT_STOPPED, Runner, configure_logging, serve
from .sink import FILE_FORMATS, sink_of
from .sink import _field as jvm_field  # the JVM writer's private fields, read as the sink guard reads them

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

EXIT_SCRIPT_REFUSED = 4
DEFAULT_START_TIMEOUT = 300.0  # seconds from the script's start to its query's: a script that reads a large
# static table first may take a while; one that never starts a query must not hold a driver for ever
SCRIPT_END_WAIT = 60.0  # seconds the script is given to finish after its query stopped (its own clean-up)
NO_QUERY = "SCRIPT_STARTED_NO_QUERY"
SECOND_QUERY = "SCRIPT_STARTED_SECOND_QUERY"
START_TIMEOUT = "SCRIPT_START_TIMEOUT"
FAILED_BEFORE_START = "SCRIPT_FAILED_BEFORE_START"
UNSUPPORTED = "SCRIPT_UNSUPPORTED"
NOT_GATED = "the version is a script: it writes through Spark's own sink"

# what Spark calls a sink format (DataStreamWriter.format, foreach, foreachBatch) -> its kind
_SINKS = {
    **dict.fromkeys(FILE_FORMATS, SinkKind.FILE),
    "delta": SinkKind.DELTA,
    "noop": SinkKind.NOOP,
    "kafka": SinkKind.KAFKA,
    "console": SinkKind.CONSOLE,
    "memory": SinkKind.MEMORY,
    "foreach": SinkKind.FOREACH,
    "foreachbatch": SinkKind.FOREACH_BATCH,
}
# a streaming leaf's source name (lower case) starting with one of these -> its kind (file sources are named
# FileSource[<path>], the V2 ones by their short name)
_SOURCES = (
    ("filesource", SourceKind.FILE),
    ("kafka", SourceKind.KAFKA),
    ("rate", SourceKind.RATE),
    ("delta", SourceKind.DELTA),
    ("socket", SourceKind.SOCKET),
    ("textsocket", SourceKind.SOCKET),
    ("memory", SourceKind.MEMORY),
)


class ScriptRefused(Exception):
    """The script cannot run under management as it is: its error class says why."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


def sink_kind(format_name: str | None) -> SinkKind:
    return _SINKS.get((format_name or "").lower(), SinkKind.UNKNOWN)


def source_kind(names: list[str]) -> SourceKind:
    """The kind a delivery guarantee is judged by, of a query reading `names` (its streaming leaves): one that
    cannot rewind if any cannot, unknown if any is unknown, else the first's."""
    kinds = [
        next((kind for prefix, kind in _SOURCES if name.lower().startswith(prefix)), SourceKind.UNKNOWN)
        for name in names
    ]
    for weakest in (SourceKind.SOCKET, SourceKind.MEMORY, SourceKind.UNKNOWN):
        if weakest in kinds:
            return weakest
    return kinds[0] if kinds else SourceKind.UNKNOWN


def _source_names(writer: DataStreamWriter) -> list[str]:
    """The streaming sources of the writer's query, as its logical plan names them (Spark Classic's JVM
    writer keeps the query in its private field `ds`, as sink.py reads its format)."""
    leaves = jvm_field(writer._jwrite, "ds").logicalPlan().collectLeaves()  # type: ignore[attr-defined]
    names = []
    for index in range(leaves.size()):
        leaf = leaves.apply(index)
        if "Streaming" not in str(leaf.getClass().getSimpleName()):
            continue  # a static side of a stream-static join
        try:
            names.append(str(leaf.sourceName()))
        except Exception:  # a streaming leaf without a name (Spark's own test sources): unknown
            names.append(str(leaf.getClass().getSimpleName()))
    return names


def declared_sink(found: SinkKind, foreach_batch: str | None) -> SinkKind:
    """The sink the delivery check judges: the one recognised, a foreachBatch the version declares idempotent (it
    writes by batch id) taken as such."""
    if found is SinkKind.FOREACH_BATCH and foreach_batch == IDEMPOTENT:
        return SinkKind.IDEMPOTENT_FOREACH_BATCH
    return found


def recognise(writer: DataStreamWriter, foreach_batch: str | None = None) -> StreamingJob:
    """The script's query as the delivery check needs it: source and sink read from what Spark holds, with what
    the version declares of its foreachBatch (`foreach_batch` in the jobs file)."""
    jwriter = writer._jwrite  # type: ignore[attr-defined]
    sink = declared_sink(sink_kind(str(jvm_field(jwriter, "source") or "")), foreach_batch)
    names = _source_names(writer)
    log.info("the script's query reads %s and writes a %s sink", names or "no streaming source", sink)
    return StreamingJob(writer, sink=sink, source=source_kind(names))


def declaration_unused(job: StreamingJob, foreach_batch: str | None) -> str | None:
    """A warning when the version declares a foreachBatch the script's query does not have."""
    if foreach_batch is None or job.sink is SinkKind.IDEMPOTENT_FOREACH_BATCH:
        return None
    return (
        f'the version declares foreach_batch = "{foreach_batch}", but the script\'s query writes a {job.sink} sink, '
        "not a foreachBatch: the declaration does not apply (drop it from the jobs file)"
    )


def _option(writer: DataStreamWriter, name: str) -> str | None:
    value = jvm_field(writer._jwrite, "extraOptions").get(name)  # type: ignore[attr-defined]
    return str(value.get()) if value.isDefined() else None


class Takeover:
    """What the patched `start` shares with the main thread: the one query, the writer it came from (a drain
    starts it again), and the runtime's own error raised inside the script's call (a refusal, a pre-flight's
    Spark error), which is the deployment's error whatever the script does with it."""

    def __init__(self) -> None:
        self.query: StreamingQuery | None = None
        self.runs: list[StreamingQuery] = []  # every query the runtime started of the script's writer
        self.writer: DataStreamWriter | None = None
        self.table: str | None = None  # the script's toTable target
        self.job: StreamingJob | None = None
        self.delivery: DeliveryPlan | None = None
        self.error: BaseException | None = None
        self.script_error: BaseException | None = None
        self.closed: str | None = None  # why a start from now on is refused
        self.called = threading.Event()  # the script called start(): the start timeout no longer runs
        self.started = threading.Event()  # ... and the runtime has started its query (or refused it)
        self.script_done = threading.Event()
        self.passthrough = threading.local()  # set while the runtime itself starts the writer


class ScriptRunner(Runner):
    """A managed run of a script: Runner's lifecycle (session, heartbeat, standby, failure classes) with the
    query taken over from the script instead of built."""

    def __init__(
        self,
        script: str,
        args: RuntimeArgs,
        job_args: list[str],
        start_timeout: float,
        foreach_batch: str | None = None,
    ) -> None:
        super().__init__(_no_build, args, job_args)
        self.script = script
        self.start_timeout = start_timeout
        self.foreach_batch = foreach_batch  # what the version declares of its foreachBatch: "idempotent" or None
        self.takeover = Takeover()

    def _warm_up_query(self) -> None:
        """Nothing: a script's query exists only once the script runs it (its standby gets the session's warm-up)."""

    def _run(self) -> int:
        try:
            unsupported = self._unsupported()
            if unsupported:
                raise ScriptRefused(
                    UNSUPPORTED,
                    f"the script {self.script} cannot take {unsupported} (an upgrade that changes the state asks "
                    "for it): a script starts its query itself and declares no state horizon or initial state. "
                    "Upgrade it by stop and restore, or write it to the build contract",
                )
            return self._run_taken_over()
        except ScriptRefused as exc:
            log.error("%s", exc)
            self.board.finish(State.FAILED, error_class=exc.error_class, error_message=str(exc))
            return EXIT_SCRIPT_REFUSED

    def _run_taken_over(self) -> int:
        takeover, request = self.takeover, None
        export_broker(self.spark)  # the job's broker in the script's environment, in every deploy mode
        with _patched(self._on_start):
            thread = threading.Thread(target=self._run_script, name="savepoints-script", daemon=True)
            thread.start()
            try:
                query = self._await_query()
                if query is None:
                    return EXIT_STOPPED
                if self.args.preflight_probe is not None:  # the probe ran, and ended, inside the script's call
                    self.board.finish(State.STOPPED)
                    return EXIT_STOPPED
                request = self._supervise(query)
                self._raise_runtime_error()  # a second query: the first was stopped for it
                if request is not None and request.drain:
                    log.info("draining: processing what is available, then stopping (request %s)", request.id)
                    assert takeover.writer is not None and takeover.job is not None and takeover.delivery is not None
                    self._supervise(self._runtime_start(takeover.writer, takeover.job, takeover.delivery, DRAIN))
            finally:
                takeover.closed = takeover.closed or "the deployment has ended"
                self._stop_query()
            thread.join(SCRIPT_END_WAIT)
            if thread.is_alive():
                log.warning(
                    "the script did not end within %.0fs of its query's stop: the driver ends it", SCRIPT_END_WAIT
                )
            elif takeover.script_error is not None:
                log.warning("the script failed after its query stopped: %s", takeover.script_error)
        self.board.finish(State.STOPPED)
        log.info("stopped%s", f" on request {request.id}" if request else " (the query ended by itself)")
        return EXIT_STOPPED

    def _unsupported(self) -> str | None:
        """What the engine asked of this run that only a built job can do: a seeded start (a replay's green), an
        initial state or a migration run (upgrades that change the state)."""
        asked = {"a migration run": self.args.migration, "a seeded start": self.args.seed}
        asked["an initial state"] = self.args.initial_state
        return ", ".join(what for what, value in asked.items() if value) or None

    def _run_script(self) -> None:
        """The script as `python script.py JOB_ARGS` runs it: its own argv, its directory first on sys.path."""
        takeover = self.takeover
        sys.argv = [self.script, *self.job_args]
        sys.path.insert(0, str(Path(self.script).resolve().parent))
        try:
            runpy.run_path(self.script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                takeover.script_error = exc
        except BaseException as exc:  # the script's own failure: reported by the main thread
            takeover.script_error = exc
            query = takeover.query
            if query is not None and query.isActive:  # it failed beside its running query (not the query)
                takeover.error = takeover.error or exc
                query.stop()
            log.error("the script %s failed:\n%s", self.script, "".join(traceback.format_exception(exc)))
        finally:
            takeover.script_done.set()

    def _await_query(self) -> StreamingQuery | None:
        """The script's query once started; None when a stop request came first (the deployment is STOPPED)."""
        takeover = self.takeover
        deadline = time.monotonic() + self.start_timeout
        while not takeover.started.wait(min(self.args.poll_interval, 0.2)):
            if takeover.script_done.is_set() and not takeover.started.is_set():
                self._raise_runtime_error()
                error = takeover.script_error
                if error is not None:
                    what = f"exited with code {error.code}" if isinstance(error, SystemExit) else f"failed: {error!r}"
                    raise ScriptRefused(
                        FAILED_BEFORE_START,
                        f"the script {self.script} {what} before it started its query (traceback in the driver "
                        "log): fix the script, or its arguments in the jobs file",
                    )
                raise ScriptRefused(
                    NO_QUERY,
                    f"the script {self.script} ended without starting a streaming query: a managed script starts "
                    "exactly one (writeStream...start() or toTable())",
                )
            if takeover.called.is_set():
                continue  # the runtime is starting (or probing) the query in the script's call
            if time.monotonic() >= deadline:
                takeover.closed = "it did not start its query in time"
                raise ScriptRefused(
                    START_TIMEOUT,
                    f"the script {self.script} started no streaming query within {self.start_timeout:g}s: a managed "
                    "script starts exactly one, without waiting for input first",
                )
            request = self.control.next_stop()
            if request is not None:
                takeover.closed = f"stop request {request.id} came before it"
                self.board.acknowledge(request.id, State.STOPPING)
                self.board.finish(State.STOPPED)
                log.info("stop request %s came before the script started its query: stopped", request.id)
                return None
        self._raise_runtime_error()
        return takeover.query

    def _raise_runtime_error(self) -> None:
        if self.takeover.error is not None:
            raise self.takeover.error

    def _stop_query(self) -> None:
        """Nothing started for the script outlives its run: its query, and a drain's run of it."""
        for query in self.takeover.runs:
            if query.isActive:
                query.stop()

    # -- in the script's thread: its call of start() or toTable()
    def _on_start(self, writer: DataStreamWriter, table: str | None) -> StreamingQuery:
        takeover = self.takeover
        if getattr(takeover.passthrough, "on", False):  # the runtime's own start of the writer (Runner._start)
            query = _ORIGINAL["toTable"](writer, takeover.table) if takeover.table else _ORIGINAL["start"](writer)
            takeover.runs.append(query)
            return query
        takeover.called.set()
        try:
            if takeover.closed:
                raise ScriptRefused(START_TIMEOUT, f"the script started its query after {takeover.closed}")
            if takeover.query is not None:
                refused = ScriptRefused(
                    SECOND_QUERY,
                    f"the script {self.script} started a second streaming query: a managed script runs exactly one "
                    "(several queries in one driver are not supported: split them into jobs of their own)",
                )
                takeover.error = takeover.error or refused  # before the stop, which the main thread sees at once
                takeover.query.stop()  # nothing may be left running
                raise refused
            query = self._take_over(writer, table)
        except BaseException as exc:
            takeover.error = takeover.error or exc
            takeover.started.set()
            raise
        takeover.started.set()
        return query

    def _take_over(self, writer: DataStreamWriter, table: str | None) -> StreamingQuery:
        takeover = self.takeover
        takeover.writer, takeover.table = writer, table
        job = takeover.job = recognise(writer, self.foreach_batch)
        if self.args.preflight_probe is not None:
            return self._probe(writer, self.args.preflight_probe)
        try:
            delivery = plan(self.args.delivery, job, self.args.checkpoint)
        except DeliveryRefused as exc:
            raise DeliveryRefused(
                f"{exc} (recognised from the script's query: a {job.source} source, a {job.sink} sink; "
                'docs/writing-a-job.md, "Bring your script as it is")'
            ) from None
        takeover.delivery = delivery
        unused = declaration_unused(job, self.foreach_batch)
        warnings = [*delivery.warnings, *self._replaced(writer, delivery.checkpoint), *([unused] if unused else [])]
        for warning in warnings:
            log.warning("%s", warning)
        self.board.update(warnings=warnings)
        self._guard_sink(job, delivery)
        takeover.query = self._runtime_start(writer, job, delivery, self.args.trigger)
        return takeover.query

    def _runtime_start(
        self, writer: DataStreamWriter, job: StreamingJob, delivery: DeliveryPlan, trigger: Trigger
    ) -> StreamingQuery:
        """Runner._start (checkpoint location, query name, trigger), its start() passed through the patch."""
        self.takeover.passthrough.on = True
        try:
            return self._start(writer, job, delivery, trigger)
        finally:
            self.takeover.passthrough.on = False

    def _replaced(self, writer: DataStreamWriter, checkpoint: str) -> list[str]:
        """What the script set that the deployment replaces, worth a warning: its checkpoint location (its state
        there is not taken over) and its trigger."""
        found = []
        own = _option(writer, "checkpointLocation")
        if own is not None and own.rstrip("/") != checkpoint.rstrip("/"):
            found.append(
                f"the script sets checkpointLocation {own}; the deployment's own {checkpoint} is used instead. To "
                f"carry over the state in {own}, snapshot it (`savepoints create {self.args.job} --checkpoint "
                f"{own}`) and deploy with `--restore SNAPSHOT_ID`"
            )
        trigger = str(jvm_field(writer._jwrite, "trigger").toString())  # type: ignore[attr-defined]
        if trigger != "ProcessingTimeTrigger(0)":  # Spark's default: the script set none
            found.append(f"the script's trigger {trigger} is replaced by the jobs file's {self.args.trigger.spec}")
        return found

    def _probe(self, writer: DataStreamWriter, probe: str) -> StreamingQuery:
        """The pre-flight (Runner._preflight) on the script's writer: the pending batch planned once on the
        checkpoint and once on the probe copy, into the noop sink; the status says what the script writes."""
        self.board.promote(State.STARTING, State.RUNNING)
        sink = sink_of(writer, self.spark)
        self.listener.sink = sink.description if sink else None
        self.board.update(sink=self.listener.sink, gate={"not_gated": NOT_GATED})
        query = None
        for location in (self.args.checkpoint, probe):
            noop = writer.format("noop").option("checkpointLocation", location).trigger(once=True)
            query = _ORIGINAL["start"](noop)
            self.listener.follow(str(query.id))
            log.info("pre-flight: re-planning the pending batch on %s", location)
            query.awaitTermination()  # raises the incompatibility, if any
        assert query is not None
        self.takeover.query = query
        return query


def _no_build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    raise AssertionError("a script version builds nothing: its query is taken over when the script starts it")


_ORIGINAL: dict[str, Callable[..., Any]] = {}


@contextmanager
def _patched(on_start: Callable[[DataStreamWriter, str | None], StreamingQuery]) -> Iterator[None]:
    """DataStreamWriter.start and toTable hand the writer, with what the call passed applied as PySpark applies
    it, to `on_start`; SparkSession.stop does nothing (the runtime stops the session when the deployment ends,
    and a script's `spark.stop()` after its query would pull the session from under the final status)."""
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    def take(
        writer: DataStreamWriter,
        table: str | None,
        path: Any,
        format: Any = None,
        outputMode: Any = None,
        partitionBy: Any = None,
        queryName: Any = None,
        **options: Any,
    ) -> StreamingQuery:
        """What PySpark's start and toTable do with their arguments before they start, then `on_start`."""
        writer.options(**options)
        if outputMode is not None:
            writer.outputMode(outputMode)
        if partitionBy is not None:
            writer.partitionBy(partitionBy)
        if format is not None:
            writer.format(format)
        if queryName is not None:
            writer.queryName(queryName)
        if path is not None:
            writer.option("path", path)
        return on_start(writer, table)

    def start(self: DataStreamWriter, path: Any = None, *args: Any, **kwargs: Any) -> StreamingQuery:
        return take(self, None, path, *args, **kwargs)

    def to_table(self: DataStreamWriter, tableName: str, *args: Any, **kwargs: Any) -> StreamingQuery:
        return take(self, tableName, None, *args, **kwargs)

    def stop(self: SparkSession) -> None:
        log.info("the script's spark.stop() is left to the runtime, which stops the session when the deployment ends")

    _ORIGINAL.update(start=DataStreamWriter.start, toTable=DataStreamWriter.toTable, stop=SparkSession.stop)
    DataStreamWriter.start, DataStreamWriter.toTable, SparkSession.stop = start, to_table, stop  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DataStreamWriter.start, DataStreamWriter.toTable = _ORIGINAL["start"], _ORIGINAL["toTable"]  # type: ignore[method-assign]
        SparkSession.stop = _ORIGINAL["stop"]  # type: ignore[method-assign]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run_script", allow_abbrev=False, add_help=False)
    parser.add_argument("--script", required=True, help="the script to run as it is")
    parser.add_argument(
        "--script-start-timeout", type=seconds_option("--script-start-timeout"), default=DEFAULT_START_TIMEOUT
    )
    parser.add_argument(
        "--script-foreach-batch", choices=[IDEMPOTENT], default=None, help="its foreachBatch writes by batch id"
    )
    return parser


def run_script(argv: list[str] | None = None) -> NoReturn:
    """The driver of a script version (spark_jobs/tools/run_script.py): `--script FILE [--script-start-timeout
    SECONDS] [--script-foreach-batch idempotent]`, the runtime's options (args.py), then the script's own
    arguments."""
    configure_logging()
    own, rest = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    args, job_args = parse_args(rest)
    runner = ScriptRunner(own.script, args, job_args, own.script_start_timeout, own.script_foreach_batch)
    sys.exit(serve(runner))
