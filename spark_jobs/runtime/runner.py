"""Runs one job's query under management, from session to exit code:

    STARTING --first trigger done--> RUNNING --stop request--> STOPPING --> STOPPED   (exit 0)
    with --standby: STARTING --session ready--> STANDBY --start request--> STARTING --> ...
                                                        --stop request / no start in time--> STOPPED
    a failure / the job's arguments rejected / a guarantee it cannot give or
    a sink that already holds the query's batches (sink.py)                FAILED    (exit 1 / 2 / 3)

`run(build)` is what an application file calls. `Runner` does the work and takes the session from a
factory, so that STARTING is in the store before the (slow) session exists; the benchmark hands it an
existing session to compare against the bare query in one JVM.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.rescale import PARTITIONS_CONF
from airflow_plugin.core.records.deployment import ControlRequest, DeploymentStatus, State
from airflow_plugin.core.sinks import DELTA, SinkRef
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Upgrades

from . import migration
from .args import RuntimeArgs, Trigger, parse_args, parse_duration
from .control import ControlChannel, boundary_wait, stop_at_batch_boundary
from .delivery import DeliveryPlan, DeliveryRefused, StreamingJob, plan
from .failure import Failure, describe
from .fence import FENCE_REFUSAL, FENCED, DriverFence, Fenced
from .gate import ACTIONS as GATE_ACTIONS
from .gate import SOLE, STAGING, WITHDRAWALS, GatedWriter, GateState
from .initial import INITIAL_STATE_CONF
from .migration import MigrationFailed
from .seed import MigrationRequest, SeedRefused, apply_seed
from .shape import shape_of
from .sink import SinkAhead, check_start, gated_query, query_of, sink_of
from .status import Heartbeat, ProgressListener, StatusBoard

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

Build = Callable[["SparkSession", list[str]], "StreamingJob | DataStreamWriter"]

EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
JOB_ARGUMENTS_REJECTED = "JOB_ARGUMENTS_REJECTED"
DRAIN = Trigger("available-now", None)
STANDBY_POLL = 0.1  # seconds between looks for the start request: the cutover waits on this
STANDBY_LIMIT = 1800.0  # a standby nobody starts (its upgrade was abandoned) ends after this long
# the warm-up query's state partitions: its code, classes and clients do not depend on their number, and at Spark's
# default 200 its batch (400 state stores) did not end within WARM_UP_LIMIT beside the old version on 2 cores
WARM_UP_PARTITIONS = 2
WARM_UP_LIMIT = 60.0  # seconds for the warm-up batch: STANDBY waits on it (200 partitions beside the old version: slow)


class Runner:
    """One managed run. `run()` writes STARTING first, then asks for the session; it returns the exit
    code and never raises for a failure of the job: that becomes FAILED in the status."""

    spark: SparkSession

    def __init__(self, build: Build, args: RuntimeArgs, job_args: list[str]) -> None:
        self.build = build
        self.args = args
        self.job_args = job_args
        self.deployments = Deployments(open_storage(args.store))
        previous = self.deployments.status(args.job, args.deployment)
        handled = previous.handled_requests if previous else []
        # a restarted deployment keeps its first rows' batch and event times: a replay checks its start against it
        first_rows = previous.first_rows if previous else None
        self.board = StatusBoard(
            self.deployments,
            args.job,
            args.deployment,
            DeploymentStatus(
                State.STARTING,
                time.time(),
                pid=os.getpid(),
                handled_requests=list(handled),
                first_rows=first_rows,
            ),
        )
        # a later attempt of this deployment (YARN's second driver attempt) continues with the gate its last status
        # recorded, not the one its arguments began with: what it applied and answered, and its upgrade's requests
        self.resumed_gate = GateState.of(previous.gate) if previous else None
        self.control = ControlChannel(self.deployments, args.job, args.deployment, handled)
        self.listener = ProgressListener(self.board)
        self.gated: GatedWriter | None = None
        fence = args.fence_interval
        self.fence = DriverFence(self.deployments.storage, args.job, args.deployment, fence) if fence else None

    def run(self, session: Callable[[], SparkSession]) -> int:
        self.board.update()  # STARTING, before the session: creating one takes seconds
        heartbeat = Heartbeat(self.board, self.args.heartbeat_interval, self.fence).start()
        listening = False
        try:
            self.spark = session()
            context = self.spark.sparkContext
            self.board.update(app_id=context.applicationId, ui_url=context.uiWebUrl)
            self.spark.streams.addListener(self.listener)
            listening = True
            if self.args.standby and not self._await_start():
                self.board.finish(State.STOPPED)
                return EXIT_STOPPED
            return self._run()
        except (DeliveryRefused, SinkAhead, SeedRefused) as exc:  # refused before any query started
            log.error("%s", exc)
            self.board.finish(State.FAILED, error_class=exc.error_class, error_message=str(exc))
            return EXIT_REFUSED
        except Fenced as exc:  # another driver writes the job's output now (fence.py): nothing more is committed
            log.error("%s", exc)
            self.board.finish(State.FAILED, error_class=exc.error_class, error_message=str(exc))
            return EXIT_FAILED
        except MigrationFailed as exc:  # the run's report (status.migration) says what was compared
            log.error("%s", exc)
            self.board.finish(State.FAILED, error_class=exc.error_class, error_message=str(exc))
            return EXIT_FAILED
        except SystemExit as exc:  # the job's own argument parser rejected its arguments (argparse exits)
            from .arguments import rejection_message  # argparse's complaint, and what a removed argument became

            message = rejection_message(exc, self.job_args)
            log.error("%s", message)
            self.board.finish(State.FAILED, error_class=JOB_ARGUMENTS_REJECTED, error_message=message)
            return EXIT_USAGE
        except Exception as exc:  # any failure of the job ends as FAILED with its class, not as a traceback
            failure = describe(exc)
            if self.fence is not None and (self.fence.superseded or FENCE_REFUSAL in failure.message):
                failure = Failure(FENCED, self.fence.superseded or failure.message)  # the JVM's fence refused a commit
            log.error("query failed: [%s] %s", failure.error_class, failure.message)
            self._fail(failure)
            return EXIT_FAILED
        finally:
            heartbeat.stop()
            if listening:
                self.spark.streams.removeListener(self.listener)

    def _run(self) -> int:
        if self.args.migration is not None:
            return self._migrate(self.args.migration)
        if self.args.preflight_probe is not None:
            return self._preflight(self.args.preflight_probe)
        if self.args.initial_state:  # before the build: the job's build asks for it (initial.py)
            self.spark.conf.set(INITIAL_STATE_CONF, self.args.initial_state)
        job = self._build()
        delivery = plan(self.args.delivery, job, self.args.checkpoint)
        for warning in delivery.warnings:
            log.warning("%s", warning)
        request = self.control.next_stop()  # a stop that came while the session started
        if request is None:
            self.board.update(query_shape=self._shape(job))
            self._guard_sink(job, delivery)
            if self.args.seed is not None:
                apply_seed(self.spark, delivery.checkpoint, self.args.seed)
            query = self._start(self._writer(job, delivery), job, delivery, self.args.trigger)
            request = self._supervise(query)
        else:
            self.board.acknowledge(request.id, State.STOPPING)
        if request is not None and request.drain:
            log.info("draining: processing what is available, then stopping (request %s)", request.id)
            job = self._build()
            self._supervise(self._start(self._writer(job, delivery), job, delivery, DRAIN))
        self.board.finish(State.STOPPED)
        log.info("stopped%s", f" on request {request.id}" if request else " (the query ended by itself)")
        return EXIT_STOPPED

    def _await_start(self) -> bool:
        """STANDBY until a start request (True) or a stop request or the time limit (False). The start
        request carries the SQL confs the restored state needs: set before the query is built."""
        self._warm_up()
        self.board.promote(State.STARTING, State.STANDBY)
        log.info("standby: session ready, waiting for a start request")
        deadline = time.monotonic() + STANDBY_LIMIT
        while time.monotonic() < deadline:
            request = self.control.next_request("start", "stop")
            if request is not None and request.action == "stop":
                self.board.acknowledge(request.id, State.STOPPING)
                log.info("standby ended by stop request %s", request.id)
                return False
            if request is not None:
                for key, value in request.conf.items():
                    self.spark.conf.set(key, value)
                if request.gate:  # the restored snapshot's deployment wrote only this interval (gate.py)
                    after, until = request.gate.get("after"), request.gate.get("until")
                    self.args = replace(self.args, gate_after=after, gate_until=until)
                self.board.acknowledge(request.id, State.STARTING)
                log.info("start request %s: starting the query", request.id)
                return True
            time.sleep(STANDBY_POLL)
        log.warning("standby: no start request within %.0fs, ending", STANDBY_LIMIT)
        return False

    def _warm_up(self) -> None:
        """Pay, while nothing waits on us, what a fresh JVM's first batch would otherwise pay in the cutover:
        class loading, code generation and task set-up (one small shuffle), then this version's own query
        and the Delta table it writes (`_warm_up_query`). A warm-up that fails changes nothing: the real start
        meets the same problem and reports it."""
        started = time.monotonic()
        self.spark.range(0, 10_000, numPartitions=2).selectExpr("id % 7 AS k").groupBy("k").count().collect()
        try:
            self._warm_up_query()
        except Exception as exc:
            log.warning("standby: warm-up of the query skipped: %s", describe(exc).message)
        log.info("standby: warmed up in %.1fs", time.monotonic() - started)

    def _warm_up_query(self) -> None:
        """One batch of the version's own query on a throwaway local checkpoint (the deployment's own location
        holds its restore), written to the noop sink, or to a throwaway local Delta table when the job writes
        Delta (never the job's own sink: the old version still writes it). The source's client, the state
        store's library, the query's generated code and the sink's write path are then loaded. Then the job's
        table is read once, so that its first commit updates a cached table log instead of loading it.
        Measured on the example job at 3 partitions: the first batch after the cutover took 13 s cold, against
        4 s for a running query's batch."""
        job = self._build()
        sink = sink_of(job.writer, self.spark)
        table = sink.location if sink is not None and sink.kind == DELTA else None
        with tempfile.TemporaryDirectory(prefix="standby-warm-up-") as directory:
            scratch = Path(directory).as_uri()  # the driver's disk, whatever the cluster's default filesystem
            writer = job.writer.option("checkpointLocation", f"{scratch}/checkpoint")
            writer = writer.option("path", f"{scratch}/table") if table is not None else writer.format("noop")
            configured = self.spark.conf.get(PARTITIONS_CONF, None)
            self.spark.conf.set(PARTITIONS_CONF, str(WARM_UP_PARTITIONS))  # a fresh query takes it at start
            try:  # its own trigger (processing time: the source's limits per batch hold); stopped after one batch
                query = writer.queryName(f"{self.args.job}-warm-up").start()
            finally:
                if configured is None:
                    self.spark.conf.unset(PARTITIONS_CONF)
                else:
                    self.spark.conf.set(PARTITIONS_CONF, configured)
            self.listener.ignore(str(query.id))
            deadline = time.monotonic() + WARM_UP_LIMIT
            while not query.awaitTermination(STANDBY_POLL) and time.monotonic() < deadline:
                if query.lastProgress is not None:
                    break
            progress = query.lastProgress
            query.stop()
        if progress is not None:
            log.info("standby: warm-up query ran its batch %s (%s rows)", progress["batchId"], progress["numInputRows"])
        else:
            log.warning("standby: warm-up query ran no batch within %.0fs", WARM_UP_LIMIT)
        if table is not None:
            columns = self.spark.read.format("delta").load(table).columns  # resolving it loads the log
            log.info("standby: Delta table %s read (%d columns)", table, len(columns))

    def _preflight(self, probe: str) -> int:
        """Make Spark plan and run the pending batch of each copy once (its commit was removed), writing
        to the noop sink: Spark's own state compatibility checks run on that first planned batch. The status
        says what the version writes and whether its writes can be gated (an upgrade's mode depends on it)."""
        self.board.promote(State.STARTING, State.RUNNING)
        job = self._build()
        sink, gated = sink_of(job.writer, self.spark), gated_query(job, self.spark)
        declared = {"not_gated": gated} if isinstance(gated, str) else GateState(str(job.gate_column)).to_dict()
        self.listener.sink = sink.description if sink else None  # what it writes, not the noop it runs with
        shape = self._shape(job)
        self.board.update(sink=self.listener.sink, gate=declared, replay=declared_replay(job), query_shape=shape)
        for location in (self.args.checkpoint, probe):
            writer = self._build().writer.format("noop").option("checkpointLocation", location)
            query = writer.trigger(once=True).start()
            self.listener.follow(str(query.id))
            log.info("pre-flight: re-planning the pending batch on %s", location)
            query.awaitTermination()  # raises the incompatibility, if any
        self.board.finish(State.STOPPED)
        return EXIT_STOPPED

    def _migrate(self, request: MigrationRequest) -> int:
        """The migration run (migration.py): make this version's initial state from the old state, check it,
        and check that this version's query takes it in as returned."""
        self.board.promote(State.STARTING, State.RUNNING)
        function = request.function
        takes = self._build().initial_state
        if takes is None:
            raise MigrationFailed(
                function,
                "the version declares no initial state (StreamingJob(initial_state=InitialState(...))): only a "
                "transformWithState takes one; rebuild the state by replay instead",
            )
        old = migration.OldState(self.spark, request.state, request.batch_id)
        result = migration.call(function, migration.load(function), old)
        migration.check_schema(function, result, takes)
        migration.check_keys(function, result, takes.keys)
        result.write.mode("overwrite").parquet(request.output)
        written = self.spark.read.parquet(request.output)  # what green reads: compared, not the function's plan
        report: dict[str, Any] = {"function": function, "rows": written.count(), "keys": takes.keys, "compared": []}
        self.board.update(migration=report)
        # the version's own query, its first batch only, on the run's throwaway checkpoint: a seeded batch 0
        # reads nothing (seed.py), so the state it commits is the initial state alone
        apply_seed(self.spark, self.args.checkpoint, request.seed, only_kafka=False)
        self.spark.conf.set(INITIAL_STATE_CONF, request.output)
        writer = self._build().writer.format("noop").option("checkpointLocation", self.args.checkpoint)
        query = writer.trigger(once=True).start()
        self.listener.follow(str(query.id))
        query.awaitTermination()
        mismatches, shown = migration.compare(self.spark, self.args.checkpoint, 0, written, takes)
        report |= {"compared": takes.variables, "mismatches": mismatches}
        self.board.update(migration=report)
        if mismatches:
            raise MigrationFailed(
                function, f"{mismatches} key(s) read back from the version's state differ: {'; '.join(shown)}"
            )
        log.info("migration by %s: %d rows of initial state, taken in as returned", function, report["rows"])
        self.board.finish(State.STOPPED)
        return EXIT_STOPPED

    def _build(self) -> StreamingJob:
        built = self.build(self.spark, list(self.job_args))
        return built if isinstance(built, StreamingJob) else StreamingJob(built)

    def _guard_sink(self, job: StreamingJob, delivery: DeliveryPlan) -> None:
        """Before the first start: record the sink the query will write, and refuse (SinkAhead) when it
        already holds batches the query would run (sink.py). A drain's second start continues the same
        checkpoint, whose batches are the sink's own."""
        sink = sink_of(job.writer, self.spark)
        if sink is None:
            return
        self.board.update(sink=sink.description)
        gated = not isinstance(gated_query(job, self.spark), str)  # the gate runs a batch's plan before its write
        check_start(sink, delivery.checkpoint, runs_held_batches=gated)

    def _writer(self, job: StreamingJob, delivery: DeliveryPlan) -> DataStreamWriter:
        """The job's own writer; or, for a job whose Delta writes can be gated (it names its gate column), the
        same query written batch by batch through the gate (gate.py), which a blue/green upgrade steers."""
        gated = gated_query(job, self.spark)
        if isinstance(gated, str):
            if job.gate_column:
                log.warning("the job names gate column %s, but %s: its writes are not gated", job.gate_column, gated)
            return job.writer
        query, target = gated
        state = self.gated.gate if self.gated else self._initial_gate(str(job.gate_column))  # a drain keeps the gate
        self.gated = GatedWriter(
            self.spark,
            target,
            state,
            delivery.checkpoint,
            self._report_gate,
            self._answer,
            self._gate_refusal,
            fence_check=self.fence.check if self.fence is not None else None,  # right before each Delta commit
            holder=self.args.deployment,
        )
        self.listener.sink = SinkRef(DELTA, target.path).description  # Spark reports ForeachBatchSink
        self.board.update(gate=state.to_dict(), sink=self.listener.sink)
        log.info("writing %s through the gate (%s)", target.path, state.to_dict())
        return query.writeStream.outputMode("append").foreachBatch(self.gated)

    def _shape(self, job: StreamingJob) -> dict[str, Any] | None:
        query = query_of(job.writer, self.spark)
        return shape_of(query, job.gate_column) if query is not None else None

    def _initial_gate(self, column: str) -> GateState:
        """The gate this run starts with: where a previous attempt of this deployment left it, else the arguments'
        (a restored snapshot's interval; a new version staging beside the old one)."""
        resumed = self.resumed_gate
        if resumed is not None and resumed.column == column:
            log.info("a later attempt of this deployment: the gate as its status left it (%s)", resumed.to_dict())
            return resumed
        args = self.args
        role = STAGING if args.gate_staging else SOLE
        return GateState(column, role, args.gate_after, args.gate_until, staging=args.gate_staging)

    def _gate_refusal(self, upgrade_id: str | None) -> str | None:
        return Upgrades(self.deployments.storage).gate_refusal(self.args.job, upgrade_id)

    def _report_gate(self, gate: GateState) -> None:
        self.board.update(gate=gate.to_dict())

    def _answer(self, request: ControlRequest, answer: str) -> None:
        self.board.answer(request.id, answer)

    def _start(
        self, writer: DataStreamWriter, job: StreamingJob, delivery: DeliveryPlan, trigger: Trigger
    ) -> StreamingQuery:
        writer = (
            writer.queryName(job.name or self.args.job)
            .option("checkpointLocation", delivery.checkpoint)
            .trigger(**trigger.spark_kwargs())
        )
        if self.fence is not None and not self.fence.armed:  # a writer from its first commit on (a standby: now)
            self.fence.arm(self.spark)
        query = writer.start()
        self.listener.follow(str(query.id))
        self.board.update(query_id=str(query.id), run_id=str(query.runId))
        log.info("query %s run %s started, trigger %s, %s", query.id, query.runId, trigger.spec, delivery.delivery)
        return query

    def _supervise(self, query: StreamingQuery) -> ControlRequest | None:
        """Wait for the query to end by itself (available-now; raises on failure) or for a stop request,
        which is honoured at a batch boundary. Returns the honoured request."""
        while not query.awaitTermination(self.args.poll_interval):
            if self.fence is not None and self.fence.superseded:  # idle input commits nothing that would fail
                query.stop()
                raise Fenced(self.fence.superseded)
            self._note_running(query)
            request = self.control.next_request("stop", *GATE_ACTIONS)
            if request is not None and request.action in GATE_ACTIONS:  # decided between two batches
                if self.gated is not None:
                    self.gated.handle(request)
                elif request.action in WITHDRAWALS:  # nothing of the upgrade's was ever applied here
                    self._answer(request, "accepted")
                else:
                    self._answer(request, "declined: this deployment's writes are not gated")
                continue
            if request is not None:
                self.board.acknowledge(request.id, State.STOPPING)
                where = stop_at_batch_boundary(query, self._boundary_wait(), self.listener.batch_done)
                log.info("stop request %s honoured (%s)", request.id, where)
                query.awaitTermination()  # raises if the query had failed before the stop
                return request
        return None

    def _note_running(self, query: StreamingQuery) -> None:
        """RUNNING once the first trigger is done. The listener says so on the first progress or idle
        event; this covers a first trigger without data before its idle event. `status` is one cheap
        JVM call (`lastProgress` would cost dozens of py4j round trips)."""
        if self.board.current.state is State.STARTING and str(query.status["message"]).startswith("Waiting"):
            self.board.promote(State.STARTING, State.RUNNING)

    def _boundary_wait(self) -> float:
        last_batch = (self.board.current.batch_duration_ms or 0) / 1000
        return boundary_wait(self.args.trigger.seconds, last_batch)

    def _fail(self, failure: Failure) -> None:
        self.board.finish(State.FAILED, error_class=failure.error_class, error_message=failure.message)


def declared_replay(job: StreamingJob) -> dict[str, int | None]:
    """What the job declares for a replay (DeploymentStatus.replay): its state horizon in milliseconds, or None."""
    horizon = parse_duration(job.state_horizon, "state_horizon") if job.state_horizon else None
    return {"state_horizon_ms": None if horizon is None else round(horizon * 1000)}


def _session(args: RuntimeArgs) -> SparkSession:
    """The session spark-submit configured (master, --conf), named after the deployment."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName(f"{args.job}/{args.deployment}").getOrCreate()


def main(build: Build, argv: list[str] | None = None) -> int:
    """Parse the command line, create the session, run the job under management; the exit code."""
    args, job_args = parse_args(sys.argv[1:] if argv is None else argv)
    return serve(Runner(build, args, job_args))


def serve(runner: Runner) -> int:
    """Run `runner` on the session spark-submit configured, stopped at the end; the exit code."""
    try:
        return runner.run(lambda: _session(runner.args))
    finally:
        if hasattr(runner, "spark"):
            runner.spark.stop()


def configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per listener callback otherwise


def run(build: Build, argv: list[str] | None = None) -> NoReturn:
    """Entry point of an application file: `if __name__ == "__main__": run(build)`."""
    configure_logging()
    sys.exit(main(build, argv))
