"""A deployment's records: the record of one incarnation of a job, the heartbeat (status) its runtime writes,
and the control requests through which it is asked to stop, start, gate or publish. These are the whole
contract between the engine (Airflow, CLI) and a running job (spark_jobs/runtime): no network path to the
driver is needed. Where each lives: layout.py; who reads and writes them: core/jobs/deployments.py."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from .. import layout
from ..errors import IntegrityError
from ..storage import Storage
from ..timestamps import stamped_id, utc_now

DEFAULT_HEARTBEAT_TIMEOUT = 30.0  # seconds without a status update before a live state reads as LOST
# consecutive batches that advanced their sources but processed no row before a deployment reads as skipping
# (one alone can be an empty input file; an exactly-once sink that skips batches it already holds makes a run)
SKIP_STREAK = 2
# the error class a driver records when its JVM went away under its Python process (a py4j connection refused or
# reset): the driver cannot tell why, its cluster can (a YARN kill sends both the signal at once), so the observer
# asks the cluster and records its word instead (jobs/deployments.py ended_by_cluster)
JVM_GONE = "DRIVER_JVM_GONE"


class State(StrEnum):
    STANDBY = "STANDBY"  # a pre-started driver: session ready, waiting for its checkpoint and a start request
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    LOST = "LOST"  # never written: a live state whose heartbeat is older than the timeout

    @property
    def live(self) -> bool:
        return self in (State.STANDBY, State.STARTING, State.RUNNING, State.STOPPING)


def new_deployment_id(now: datetime | None = None) -> str:
    return stamped_id("dp", now)


@dataclass
class Deployment:
    id: str
    job: str
    version: str
    checkpoint: str  # this deployment's own live checkpoint location
    created_at: str = field(default_factory=utc_now)
    restored_from: str | None = None  # a snapshot id, or "checkpoint:<deployment id>" for latest state
    request_id: str | None = None  # the request that made it: its retries take it over (context.py Settings)
    restored_batch_id: int | None = None
    # pre-started: the snapshot already restored into its location before the cutover (an upgrade's live
    # savepoint); activating it restores only what differs (snapshots/restore.py `onto`)
    prerestored_from: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)  # mode, pid, log, driver id, app id, command
    retired_at: str | None = None
    source_gap: dict[str, Any] | None = None  # records its restore accepted to lose (guards/source.py)
    # the application and the arguments it was built with: deployments of the same build write the same sink
    build: list[str] = field(default_factory=list)
    # the SHA-256 of its code file as launched (jobs/fresh_start.py code_digest; None where not a local file): a
    # rescale runs the old deployment's code again without a pre-flight only while it is byte for byte the same
    code_digest: str | None = None
    # why it started without state (deploy.py why_fresh): latest-state of a job that never started a query, or a
    # fresh start asked for by name of a job with state, naming the state (and its batch) that was not carried over
    fresh_start: str | None = None
    # the spark-submit master it was launched with: with its spark_conf, its size (core/autoscale/policy.py size_of)
    master: str | None = None
    # the upgrade whose abort removed it (its new version, launched beside the old one): it never held the job's
    # state, so the job's newest deployment and its latest state are the ones before it
    aborted_by: str | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Deployment:
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"{where} is corrupt: {exc}") from None


@dataclass
class DeploymentStatus:
    state: State
    updated_at: float  # seconds since the epoch
    query_id: str | None = None
    run_id: str | None = None
    last_batch_id: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None  # of the last batch alone (Spark's)
    rows_per_second: float | None = None  # input rows per second over the last minute (runtime/status.py RowRate)
    input_rows_total: int | None = None  # input rows this run has processed
    # per stateful operator, as Spark's progress reported it at batch `batch_id`: name, rows, memory_bytes,
    # partitions (what a snapshot records of the state: snapshots/state_stats.py)
    state_operators: list[dict[str, Any]] | None = None
    batch_duration_ms: int | None = None
    watermark: str | None = None
    app_id: str | None = None
    ui_url: str | None = None  # the driver's Spark UI, when enabled
    sink: str | None = None  # the query's sink as Spark describes it in its progress (FileSink[<path>], ...)
    sources: list[str] = field(default_factory=list)  # its sources, as Spark describes them (KafkaV2[Subscribe[t]])
    # Kafka lag: the most records any partition of its Kafka sources is behind the latest offset, as Spark's
    # progress reports it (maxOffsetsBehindLatest), at the last batch and at the first batch of this run
    kafka_lag: int | None = None
    kafka_lag_first: int | None = None
    pid: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    handled_requests: list[str] = field(default_factory=list)
    # batches of this run whose sources advanced but which processed no row (the runtime counts them from
    # Spark's progress): {"first", "last" (of the streak), "batches" (in all), "streak" (consecutive, up to the
    # newest), "records" (read by the streak's offsets: Kafka records, 1 per other source)}; None while every
    # batch that read something processed it
    unprocessed: dict[str, int] | None = None
    # a job whose Delta writes the runtime gates (runtime/gate.py): its gate column, role and interval
    gate: dict[str, Any] | None = None
    # requests that may be declined (gate, publish): request id -> "accepted", or the reason it was declined
    answers: dict[str, str] = field(default_factory=dict)
    # what the query declares for a replay (its pre-flight run reports it): {"state_horizon_ms": int | None}
    replay: dict[str, Any] | None = None
    # what the query is made of, read from its plan (spark_jobs/runtime/shape.py): {"watermarks": [{"column",
    # "delay_ms"}], "stateful": [operator kinds], "gate_is_window_end": bool | None}, or {"unknown": why}
    query_shape: dict[str, Any] | None = None
    # the first batch that read rows: {"batch": id, "min", "max": its event times (ISO)}: a replay checks its start
    first_rows: dict[str, Any] | None = None
    # a migration run's report (spark_jobs/runtime: the initial state made and checked)
    migration: dict[str, Any] | None = None
    # what the runtime changed or doubts about the query, for a person: a script's own checkpoint location or
    # trigger it replaced (runtime/script.py), a guarantee's caveat (runtime/delivery.py)
    warnings: list[str] = field(default_factory=list)
    # its committed batches summed per 10 s over the last 30 minutes, what the autoscaler reads (core/autoscale/load.py)
    load: list[dict[str, Any]] = field(default_factory=list)

    def skipping(self) -> str | None:
        """Why a deployment that commits batches is not healthy: its last batches read input by their
        offsets and processed none of it, which is what an exactly-once sink that already holds those batch
        ids does (it skips them, so their records are lost). None when that is not so."""
        seen = self.unprocessed
        if not seen or seen.get("streak", 0) < SKIP_STREAK:
            return None
        kafka = bool(self.sources) and all(source.startswith("KafkaV2") for source in self.sources)
        records = f" ({seen['records']} Kafka records by their offsets)" if kafka and seen.get("records") else ""
        sink = f" {self.sink}" if self.sink else ""
        return (
            f"batches {seen['first']}..{seen['last']} advanced their sources{records} but processed no row: the "
            f"sink{sink} skipped them as already written, so every record they read is lost. Stop it and see "
            "the runbook (docs/operations.md, 'A sink that skips batches')"
        )

    def effective_state(self, timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, now: float | None = None) -> State:
        age = (now or time.time()) - self.updated_at
        return State.LOST if self.state.live and age > timeout else self.state

    def age(self, now: float | None = None) -> float:
        return (now or time.time()) - self.updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeploymentStatus:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}  # a newer runtime may add fields
        return cls(**{**known, "state": State(data["state"])})


# a gated deployment's role in a blue/green upgrade (status.gate, spark_jobs/runtime/gate.py): it writes every window
# of its interval; it stages beside the old version; it writes only the windows up to T; only those after T
SOLE, STAGING, BLUE, GREEN = "sole", "staging", "blue", "green"


@dataclass
class ControlRequest:
    id: str
    # "stop"; "start" for a driver in STANDBY; a blue/green cutover's "gate" and "ungate" (to the old version),
    # "publish" and "withdraw" (to the new one): runtime/gate.py
    action: str
    drain: bool = False
    conf: dict[str, str] = field(default_factory=dict)  # start: SQL confs to set before the query starts
    gate: dict[str, int] | None = None  # gate: {"margin", "floor"}; publish: {"t": the cutover, epoch ms}
    requested_at: float = field(default_factory=time.time)
    requested_by: str = ""
    upgrade: str | None = None  # the upgrade a gate request belongs to: a driver applies it only while it wants it
    expires_at: float | None = None  # epoch seconds: a gate request not applied by then is declined


def read_status(storage: Storage, job: str, deployment_id: str) -> DeploymentStatus | None:
    """A deployment's heartbeat as its runtime last wrote it; None before its first."""
    try:
        data = json.loads(storage.read(layout.status_key(job, deployment_id)))
    except FileNotFoundError:
        return None
    return DeploymentStatus.from_dict(data)


def final_status(storage: Storage, deployment: Deployment) -> DeploymentStatus | None:
    """The heartbeat of a retired deployment, once its driver ended (a terminal state): it changes no more."""
    if not deployment.retired_at:
        return None
    status = read_status(storage, deployment.job, deployment.id)
    return status if status is not None and not status.state.live else None


def failed_for_it(previous: DeploymentStatus | None, error_class: str, error_message: str) -> DeploymentStatus:
    """A FAILED status another process writes for a driver that cannot write its own (a kill, its cluster's report
    of its application): its last status with the error, the rest kept: its gate and answers (what it wrote, what
    it was asked, which a restart from its state reads), its batches and the requests it handled."""
    ended: dict[str, Any] = {"state": State.FAILED, "updated_at": time.time()}
    ended |= {"error_class": error_class, "error_message": error_message}
    return replace(previous, **ended) if previous else DeploymentStatus(**ended)


def status_json(status: DeploymentStatus) -> bytes:
    return json.dumps(asdict(status)).encode()
