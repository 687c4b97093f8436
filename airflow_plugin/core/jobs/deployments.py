"""A store's deployments: the records of each incarnation of a job (core/records/deployment.py), listed through
the job's deployment index (core/catalog/deployments.py), with the heartbeat each writes and the control
channel through which it is asked to stop. What a deployment looks like to a person or a DAG (status rows,
XComs, the CLI's JSON): `describe`, the one shape."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Collection
from dataclasses import asdict, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import layout
from ..catalog.deployments import DeploymentEntry, deployment_index
from ..catalog.index import Known, RecordIndex
from ..errors import Conflict, NotFound
from ..process import Liveness
from ..records.deployment import (
    BLUE,
    DEFAULT_HEARTBEAT_TIMEOUT,
    JVM_GONE,
    SOLE,
    STAGING,
    ControlRequest,
    Deployment,
    DeploymentStatus,
    State,
    failed_for_it,
    final_status,
    read_status,
    status_json,
)
from ..storage import Storage

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .yarn import AppReport

WRITE_ATTEMPTS = 20  # a record written by others this many times while we wrote it: give up


class Deployments:
    """Reads and writes deployment records, heartbeats and control requests in one store. Records are listed
    through each job's index; a retired deployment's heartbeat comes from there once listed (it is final)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._indexes: dict[str, RecordIndex[DeploymentEntry]] = {}
        self._finals: dict[tuple[str, str], DeploymentStatus] = {}

    def index(self, job: str) -> RecordIndex[DeploymentEntry]:
        if job not in self._indexes:
            self._indexes[job] = deployment_index(self.storage, job)
        return self._indexes[job]

    # -- records
    def put(self, deployment: Deployment) -> None:
        """Write the record (over whatever version is there), its index entry with it; a retired one's final
        heartbeat is kept in the index."""
        key = layout.deployment_key(deployment.job, deployment.id)
        final = final_status(self.storage, deployment)
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
        self.storage.write(layout.status_key(job, deployment_id), status_json(status))

    def status(self, job: str, deployment_id: str) -> DeploymentStatus | None:
        """Its heartbeat: read, unless it is a retired deployment's final one this instance listed."""
        final = self._finals.get((job, deployment_id))
        if final is not None:
            return final
        return read_status(self.storage, job, deployment_id)

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
    from .launcher import process_seen

    now = time.time() if now is None else now
    if status is None:
        state = State.STARTING
        if now - datetime.fromisoformat(deployment.created_at.replace("Z", "+00:00")).timestamp() > timeout:
            state = State.LOST
    else:
        state = status.effective_state(timeout, now)
    if state.live and process_seen(deployment.launcher) is Liveness.GONE:
        return State.LOST
    return state


YARN_ENDED = "YARN_"  # error classes of a driver YARN ended: YARN_KILLED, YARN_FAILED, YARN_FINISHED


def cluster_decides(status: DeploymentStatus | None, *, retired: bool = False) -> bool:
    """Whether the cluster's report of a driver's application says more than the driver's own last word: it never
    wrote one, it still says it is live, or it says only that its JVM went away under it (JVM_GONE; of a deployment
    not retired: a retired one's final word stands, its index keeps it)."""
    if status is None or status.state.live:
        return True
    return status.error_class == JVM_GONE and not retired


def ended_by_cluster(status: DeploymentStatus | None, report: AppReport | None) -> DeploymentStatus | None:
    """The status to record for a deployment whose application the cluster has ended while its heartbeat still
    says it is live (or it never wrote one, or wrote only that its JVM went away): FAILED, with the cluster's
    diagnostics. A driver that stops on request writes STOPPED before it exits, and YARN reports the application
    ended only after that, so a live heartbeat read after an ended report is the driver's last word: its container
    was killed, its node lost, or someone killed the application. None: nothing to record."""
    if report is None or not report.ended or not cluster_decides(status):
        return None
    ended = failed_for_it(status, f"{YARN_ENDED}{report.state}", report.summary())
    return replace(ended, app_id=ended.app_id or report.app_id)


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


def driver_seen(deployment: Deployment) -> str | None:
    """Whether the deployment's driver process runs, as this process can tell: "alive", "gone" or "cannot tell"
    (another machine or container: its heartbeat speaks for it); None for a driver of a cluster manager."""
    from .launcher import driver_process, process_seen

    return str(process_seen(deployment.launcher)) if driver_process(deployment.launcher) else None


def describe(deployment: Deployment, status: DeploymentStatus | None, state: State) -> dict[str, Any]:
    """A deployment as people and DAGs see it: `savepoints status` rows, the CLI's JSON, task XComs and the
    savepoints page all use this one shape."""
    return {
        "job": deployment.job,
        "deployment": deployment.id,
        "version": deployment.version,
        "state": str(state),
        "driver": driver_seen(deployment),
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
