"""Deployments in the store: the record of each incarnation of a job, the heartbeat its runtime writes,
and the control channel through which it is asked to stop. This is the whole contract between the
engine (Airflow, CLI) and a running job (spark_jobs/runtime): no network path to the driver is needed.
Where each lives in the store: layout.py. What a deployment looks like to a person or a DAG (status rows,
XComs, the CLI's JSON): `describe`, the one shape. A job's records are listed through its deployment index
(`DeploymentRecords`, kept by core/catalog/index.py), which also keeps the final heartbeat of each retired deployment.

Over 300 lines: the record, its heartbeat and its index entry are one contract (the index holds the record
and, once retired, its final heartbeat; reading one needs the others)."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .. import layout
from ..catalog.index import Known, RecordIndex
from ..errors import Conflict, IntegrityError, NotFound
from ..storage import ObjectInfo, Storage
from ..timestamps import utc_now

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .yarn import AppReport

DEFAULT_HEARTBEAT_TIMEOUT = 30.0  # seconds without a status update before a live state reads as LOST
# consecutive batches that advanced their sources but processed no row before a deployment reads as skipping
# (one alone can be an empty input file; an exactly-once sink that skips batches it already holds makes a run)
SKIP_STREAK = 2
WRITE_ATTEMPTS = 20  # a record written by others this many times while we wrote it: give up


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
    now = now or datetime.now(UTC)
    return f"dp-{now.strftime('%Y%m%dT%H%M%S')}{now.microsecond // 1000:03d}Z-{secrets.token_hex(2)}"


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
    # why it started without state (deploy.py why_fresh): latest-state of a job that never ran, or a fresh start
    # asked for by name of a job with state, naming the state (and its batch) that was not carried over
    fresh_start: str | None = None

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


@dataclass(frozen=True)
class DeploymentEntry:
    """A deployment as its job's index lists it: the record, and the heartbeat it ended with once retired
    (a retired deployment's driver has ended: that heartbeat is final)."""

    record: Deployment
    final: DeploymentStatus | None
    version: str | None


class DeploymentRecords:
    """A job's deployment records, as core/catalog/index.py sees them."""

    what = "deployment"

    def __init__(self, storage: Storage, job: str) -> None:
        self.storage, self.job = storage, job
        self._reader = Deployments(storage)

    def key(self, record_id: str) -> str:
        return layout.deployment_key(self.job, record_id)

    def listing(self) -> dict[str, ObjectInfo]:
        listing = self.storage.list(layout.deployments_prefix(self.job))
        return {d: info for info in listing if (d := layout.deployment_id_of(info.key, self.job))}

    def entry(self, record_id: str, raw: bytes, version: str) -> DeploymentEntry | None:
        try:
            record = Deployment.from_json(raw, f"{self.storage.uri}/{self.key(record_id)}")
        except IntegrityError as exc:
            log.warning("skipping %s", exc)
            return None
        return DeploymentEntry(record, self._reader.final(record), version)

    def dump(self, entry: DeploymentEntry) -> dict[str, Any]:
        return {"record": asdict(entry.record), "final": asdict(entry.final) if entry.final else None}

    def load(self, data: dict[str, Any], version: str) -> DeploymentEntry:
        final = DeploymentStatus.from_dict(data["final"]) if data.get("final") else None
        return DeploymentEntry(Deployment(**data["record"]), final, version)


class Deployments:
    """Reads and writes deployment records, heartbeats and control requests in one store. Records are listed
    through each job's index; a retired deployment's heartbeat comes from there once listed (it is final)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._indexes: dict[str, RecordIndex[DeploymentEntry]] = {}
        self._finals: dict[tuple[str, str], DeploymentStatus] = {}

    def index(self, job: str) -> RecordIndex[DeploymentEntry]:
        if job not in self._indexes:
            key = layout.deployment_index_key(job)
            self._indexes[job] = RecordIndex(self.storage, key, DeploymentRecords(self.storage, job))
        return self._indexes[job]

    # -- records
    def put(self, deployment: Deployment) -> None:
        """Write the record (over whatever version is there), its index entry with it; a retired one's final
        heartbeat is kept in the index."""
        key = layout.deployment_key(deployment.job, deployment.id)
        final = self.final(deployment)
        with self.index(deployment.job).changing([deployment.id]) as known:
            for _ in range(WRITE_ATTEMPTS):
                current = self.storage.stat(key)
                try:
                    if current is None or current.version is None:
                        written = self.storage.create(key, deployment.to_json())
                    else:
                        written = self.storage.replace(key, deployment.to_json(), current.version)
                except Conflict:
                    continue  # written meanwhile: the last writer wins, as an unconditional write would
                prior = current.version if current else None
                known[deployment.id] = Known(prior, written, DeploymentEntry(deployment, final, written))
                return
        raise Conflict(f"deployment {deployment.id} of job {deployment.job} kept changing while it was written: retry")

    def adopt_unlisted(self, job: str) -> list[Deployment]:
        """Settle into the job's index the records it does not list (an older savepoints keeps no index): their
        ids from one delimited listing of the job's deployments. What an operation under the job's lease does
        first, so that a deploy never misses a deployment an older savepoints started. Returns the job's
        deployments as `list` does, from the index it read."""
        index = self.index(job)
        view = index.view()
        unlisted = sorted(set(self.storage.children(layout.deployments_prefix(job))) - set(view))
        if unlisted:
            index.settle(unlisted)  # a directory without a record (a pre-flight's throwaway run) stays unlisted
            view = index.view()
            adopted = sorted(set(unlisted) & set(view))
            if adopted:
                log.warning("job %s: deployments %s were not in its index (an older savepoints?): added", job, adopted)
        return self._listed(job, view)

    def final(self, deployment: Deployment) -> DeploymentStatus | None:
        """The heartbeat of a retired deployment, once its driver ended (a terminal state): it changes no more."""
        if not deployment.retired_at:
            return None
        status = self.status(deployment.job, deployment.id)
        return status if status is not None and not status.state.live else None

    def get(self, job: str, deployment_id: str) -> Deployment:
        key = layout.deployment_key(job, deployment_id)
        try:
            raw = self.storage.read(key)
        except FileNotFoundError:
            raise NotFound(
                f"deployment {deployment_id} of job {job} does not exist in {self.storage.uri}: "
                f"see `savepoints status {job}`"
            ) from None
        return Deployment.from_json(raw, f"{self.storage.uri}/{key}")

    def list(self, job: str) -> list[Deployment]:
        """A job's deployments, oldest first: one read of its index (and of the records it marks)."""
        return self._listed(job, self.index(job).view())

    def _listed(self, job: str, view: dict[str, DeploymentEntry]) -> list[Deployment]:
        entries = sorted(view.items())
        for deployment_id, entry in entries:
            if entry.final is not None:
                self._finals[(job, deployment_id)] = entry.final
        return [entry.record for _, entry in entries]

    # -- heartbeat
    def write_status(self, job: str, deployment_id: str, status: DeploymentStatus) -> None:
        self.storage.write(layout.status_key(job, deployment_id), json.dumps(asdict(status)).encode())

    def status(self, job: str, deployment_id: str) -> DeploymentStatus | None:
        """Its heartbeat: read, unless it is a retired deployment's final one this instance listed."""
        final = self._finals.get((job, deployment_id))
        if final is not None:
            return final
        try:
            data = json.loads(self.storage.read(layout.status_key(job, deployment_id)))
        except FileNotFoundError:
            return None
        return DeploymentStatus.from_dict(data)

    # -- control channel
    def request(self, job: str, deployment_id: str, request: ControlRequest) -> None:
        self.storage.write(layout.control_key(job, deployment_id, request.id), json.dumps(asdict(request)).encode())

    def withdraw(self, job: str, deployment_id: str, request: ControlRequest) -> None:
        """Take back a request the job has not acted on (a stop that timed out)."""
        self.storage.delete([layout.control_key(job, deployment_id, request.id)])

    def remove(self, job: str, deployment_id: str) -> None:
        """Delete a deployment's record, heartbeat and requests (a pre-flight's throwaway run)."""
        with self.index(job).changing([deployment_id]):
            self.storage.delete([info.key for info in self.storage.list(layout.deployment_prefix(job, deployment_id))])

    def requests(self, job: str, deployment_id: str, skip: Collection[str] = ()) -> list[ControlRequest]:
        """Control requests, oldest first; ids in `skip` (already handled) are not even read."""
        prefix = layout.control_prefix(job, deployment_id)
        found = []
        for info in self.storage.list(prefix):
            request_id = info.key[len(prefix) :].removesuffix(".json")
            if not info.key.endswith(".json") or request_id in skip:
                continue
            try:
                found.append(ControlRequest(**json.loads(self.storage.read(info.key))))
            except (FileNotFoundError, ValueError, TypeError):
                continue  # half-visible or foreign file: ignore, the engine writes whole objects
        return sorted(found, key=lambda r: r.requested_at)


def new_request_id() -> str:
    return f"rq-{int(time.time() * 1000)}-{secrets.token_hex(2)}"


def observed_state(
    deployment: Deployment,
    status: DeploymentStatus | None,
    timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    now: float | None = None,
) -> State:
    """What a deployment really is at `now` (default: now): its heartbeat's state, LOST when the heartbeat
    is stale, and LOST at once when its local driver process is known to be gone (a SIGKILL leaves RUNNING
    behind)."""
    from .launcher import alive, on_this_host

    now = time.time() if now is None else now
    if status is None:
        state = State.STARTING
        if now - datetime.fromisoformat(deployment.created_at.replace("Z", "+00:00")).timestamp() > timeout:
            state = State.LOST
    else:
        state = status.effective_state(timeout, now)
    if state.live and on_this_host(deployment.launcher) and not alive(deployment.launcher):
        return State.LOST
    return state


YARN_ENDED = "YARN_"  # error classes of a driver YARN ended: YARN_KILLED, YARN_FAILED, YARN_FINISHED


def ended_by_cluster(status: DeploymentStatus | None, report: AppReport | None) -> DeploymentStatus | None:
    """The status to record for a deployment whose application the cluster has ended while its heartbeat still
    says it is live (or it never wrote one): FAILED, with the cluster's diagnostics. A driver that stops on
    request writes STOPPED before it exits, and YARN reports the application ended only after that, so a live
    heartbeat read after an ended report is the driver's last word: its container was killed, its node lost,
    or someone killed the application. None: nothing to record."""
    if report is None or not report.ended or (status is not None and not status.state.live):
        return None
    return DeploymentStatus(
        state=State.FAILED,
        updated_at=time.time(),
        query_id=status.query_id if status else None,
        run_id=status.run_id if status else None,
        last_batch_id=status.last_batch_id if status else None,
        app_id=status.app_id if status else report.app_id,
        sink=status.sink if status else None,
        sources=status.sources if status else [],
        handled_requests=status.handled_requests if status else [],
        error_class=f"{YARN_ENDED}{report.state}",
        error_message=report.summary(),
    )


def _rows_per_second(status: DeploymentStatus | None) -> float | None:
    """Over the last minute where the runtime reports it, else Spark's figure of the last batch (older runtimes)."""
    if status is None:
        return None
    return status.rows_per_second if status.rows_per_second is not None else status.processed_rows_per_second


def gate_summary(gate: dict[str, Any] | None) -> str | None:
    """What a gated deployment writes, for a person (status rows, the page); None for one that writes every window.
    A blue deployment drops every row of a window ending after T: on call must know while it does."""
    role = (gate or {}).get("role")
    if gate is None or (role in (None, SOLE) and gate.get("after") is None and gate.get("until") is None):
        return None
    upgrade = f" of upgrade {gate['upgrade']}" if gate.get("upgrade") else ""
    if role == STAGING:
        return f"staging{upgrade}: writes only its staging table"
    if role == BLUE:
        until, dropped = gate.get("until_at"), int(gate.get("dropped") or 0)
        return f"blue{upgrade}: writes the windows ending at or before {until}, drops the rest ({dropped} rows)"
    return f"{role}{upgrade}: writes the windows ending after {gate.get('after_at')}"


def describe(deployment: Deployment, status: DeploymentStatus | None, state: State) -> dict[str, Any]:
    """A deployment as people and DAGs see it: `savepoints status` rows, the CLI's JSON, task XComs and the
    savepoints page all use this one shape."""
    return {
        "job": deployment.job,
        "deployment": deployment.id,
        "version": deployment.version,
        "state": str(state),
        "checkpoint": deployment.checkpoint,
        "restored_from": deployment.restored_from,
        "restored_batch_id": deployment.restored_batch_id,
        "fresh_start": deployment.fresh_start,
        "heartbeat_age_s": round(status.age(), 1) if status else None,
        "last_batch_id": status.last_batch_id if status else None,
        "rows_per_second": _rows_per_second(status),
        "kafka_lag": status.kafka_lag if status else None,
        "spark_ui": status.ui_url if status else None,
        "app_id": status.app_id if status else None,
        "error": f"{status.error_class}: {status.error_message}" if status and status.error_class else None,
        "unhealthy": status.skipping() if status else None,
        "gate": gate_summary(status.gate if status else None),
        "warnings": status.warnings if status else [],
        "log": deployment.launcher.get("log"),
        "created_at": deployment.created_at,
        "retired_at": deployment.retired_at,
        "source_gap": deployment.source_gap["summary"] if deployment.source_gap else None,
    }
