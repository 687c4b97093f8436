"""Deployments in the store: the record of each incarnation of a job, the heartbeat its runtime writes,
and the control channel through which it is asked to stop. This is the whole contract between the
engine (Airflow, CLI) and a running job (spark_jobs/runtime): no network path to the driver is needed.

    jobs/<job>/deployments/<deployment_id>/deployment.json   written by the launcher
    jobs/<job>/deployments/<deployment_id>/status.json       written by the runtime (heartbeat)
    jobs/<job>/deployments/<deployment_id>/control/<request_id>.json   stop requests, written by the engine
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from ..errors import IntegrityError, NotFound
from ..snapshots.manifest import check_name, utc_now
from ..storage import Storage

DEFAULT_HEARTBEAT_TIMEOUT = 30.0  # seconds without a status update before a live state reads as LOST


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


def deployment_prefix(job: str, deployment_id: str) -> str:
    return f"jobs/{check_name(job, 'job name')}/deployments/{check_name(deployment_id, 'deployment id')}/"


@dataclass
class Deployment:
    id: str
    job: str
    version: str
    checkpoint: str  # this deployment's own live checkpoint location
    created_at: str = field(default_factory=utc_now)
    restored_from: str | None = None  # a snapshot id, or "checkpoint:<deployment id>" for latest state
    restored_batch_id: int | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)  # mode, pid, log, driver id, app id, command
    retired_at: str | None = None


@dataclass
class Status:
    state: State
    updated_at: float  # seconds since the epoch
    query_id: str | None = None
    run_id: str | None = None
    last_batch_id: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: int | None = None
    watermark: str | None = None
    app_id: str | None = None
    ui_url: str | None = None  # the driver's Spark UI, when enabled
    pid: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    handled_requests: list[str] = field(default_factory=list)

    def effective_state(self, timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, now: float | None = None) -> State:
        age = (now or time.time()) - self.updated_at
        return State.LOST if self.state.live and age > timeout else self.state

    def age(self, now: float | None = None) -> float:
        return (now or time.time()) - self.updated_at


@dataclass
class ControlRequest:
    id: str
    action: str  # "stop", or "start" for a driver in STANDBY
    drain: bool = False
    conf: dict[str, str] = field(default_factory=dict)  # start: SQL confs to set before the query starts
    requested_at: float = field(default_factory=time.time)
    requested_by: str = ""


class Deployments:
    """Reads and writes deployment records, heartbeats and control requests in one store."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    # -- records
    def put(self, deployment: Deployment) -> None:
        key = deployment_prefix(deployment.job, deployment.id) + "deployment.json"
        self.storage.write(key, json.dumps(asdict(deployment), indent=1).encode())

    def get(self, job: str, deployment_id: str) -> Deployment:
        key = deployment_prefix(job, deployment_id) + "deployment.json"
        try:
            data = json.loads(self.storage.read(key))
        except FileNotFoundError:
            raise NotFound(
                f"deployment {deployment_id} of job {job} does not exist in {self.storage.uri}: "
                f"see `savepoints status {job}`"
            ) from None
        except ValueError as exc:
            raise IntegrityError(f"{self.storage.uri}/{key} is corrupt: {exc}") from None
        return Deployment(**data)

    def list(self, job: str) -> list[Deployment]:
        """A job's deployments, oldest first."""
        prefix = f"jobs/{check_name(job, 'job name')}/deployments/"
        ids = sorted(
            {
                i.key[len(prefix) :].split("/")[0]
                for i in self.storage.list(prefix)
                if i.key.endswith("/deployment.json")
            }
        )
        return [self.get(job, deployment_id) for deployment_id in ids]

    # -- heartbeat
    def write_status(self, job: str, deployment_id: str, status: Status) -> None:
        self.storage.write(deployment_prefix(job, deployment_id) + "status.json", json.dumps(asdict(status)).encode())

    def status(self, job: str, deployment_id: str) -> Status | None:
        try:
            data = json.loads(self.storage.read(deployment_prefix(job, deployment_id) + "status.json"))
        except FileNotFoundError:
            return None
        data["state"] = State(data["state"])
        return Status(**data)

    # -- control channel
    def request(self, job: str, deployment_id: str, request: ControlRequest) -> None:
        key = deployment_prefix(job, deployment_id) + f"control/{check_name(request.id, 'request id')}.json"
        self.storage.write(key, json.dumps(asdict(request)).encode())

    def requests(self, job: str, deployment_id: str, skip: Collection[str] = ()) -> list[ControlRequest]:
        """Control requests, oldest first; ids in `skip` (already handled) are not even read."""
        prefix = deployment_prefix(job, deployment_id) + "control/"
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


def observed_state(deployment: Deployment, status: Status | None, timeout: float = DEFAULT_HEARTBEAT_TIMEOUT) -> State:
    """What a deployment really is now: its heartbeat's state, LOST when the heartbeat is stale, and LOST
    at once when its local driver process is known to be gone (a SIGKILL leaves RUNNING behind)."""
    from .launcher import alive, on_this_host

    if status is None:
        state = State.STARTING
        if time.time() - datetime.fromisoformat(deployment.created_at.replace("Z", "+00:00")).timestamp() > timeout:
            state = State.LOST
    else:
        state = status.effective_state(timeout)
    if state.live and on_this_host(deployment.launcher) and not alive(deployment.launcher):
        return State.LOST
    return state
