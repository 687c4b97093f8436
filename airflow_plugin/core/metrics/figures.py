"""What the store says of every job, as plain figures for the metrics (`savepoints metrics`, the plugin's
`/savepoints/metrics`): `observe` reads the store, openmetrics.py renders what it read.

What one scrape reads, per job: its deployment index, the heartbeat of each deployment not retired, its
snapshot catalog and its lease (a few requests, however long its history: no manifest, no retired
deployment's record); per store: the usage the last prune recorded (retention/usage.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..catalog.snapshots import SnapshotEntry
from ..errors import SavepointsError
from ..jobs.context import Context, JobContext
from ..jobs.deployments import driver_seen
from ..jobs.observe import observe_deployment
from ..jobs.spec import RUNNING
from ..lease import read_lease
from ..parallel import map_parallel
from ..reconcile.apply import declared_status
from ..records.deployment import DeploymentStatus, State
from ..records.manifest import Kind, SnapshotStatus
from ..retention.policy import parse_policy
from ..retention.usage import StoreUsage, read_usage
from ..snapshots.store import SnapshotStore
from ..timestamps import epoch_of

log = logging.getLogger(__name__)

JOB_READERS = 16  # jobs read at once


@dataclass
class DeploymentFigures:
    deployment: str
    version: str
    state: str
    status: DeploymentStatus | None
    heartbeat_age_s: float | None
    driver: str | None = None  # its process as the scraper sees it: alive, gone, cannot tell (None: a cluster's)


@dataclass
class SnapshotFigures:
    """The newest COMPLETED snapshot of one kind."""

    id: str
    batch_id: int | None
    age_s: float
    bytes: int
    uploaded_bytes: int
    state: list[dict[str, Any]]  # per operator: rows, bytes (state_stats.py), as recorded at snapshot time


@dataclass
class JobFigures:
    job: str
    store: str
    error: str | None = None  # the store could not be read: the job's figures are absent, `savepoints_job_up` 0
    deployments: list[DeploymentFigures] = field(default_factory=list)
    last: dict[str, SnapshotFigures] = field(default_factory=dict)  # kind -> its newest COMPLETED snapshot
    periods: dict[str, float] = field(default_factory=dict)  # kind -> the expected period (the jobs file)
    failed: int = 0
    last_failed_at: float | None = None  # epoch seconds
    lease: dict[str, Any] | None = None  # operation, holder, age_s, ttl_s, expired
    # a declared job's (core/reconcile/): restarts recorded, restarts left in the budget's window, and whether the
    # running version is the declared one (None: it declares no running version)
    restarts: int | None = None
    restarts_left: int | None = None
    desired_running: bool | None = None
    # a job with `autoscale` (core/autoscale/): reconcile/apply.py `_autoscale_status`, as `status` shows it
    autoscale: dict[str, Any] | None = None


@dataclass
class Figures:
    jobs: list[JobFigures]
    stores: list[StoreUsage]
    seconds: float  # how long reading took


def _last(entries: list[SnapshotEntry], kind: Kind, now: float) -> SnapshotFigures | None:
    done = [e for e in entries if e.kind is kind and e.status is SnapshotStatus.COMPLETED]
    if not done:
        return None
    e = done[-1]
    return SnapshotFigures(
        e.id,
        e.batch_id,
        round(now - epoch_of(e.completed_at or e.created_at), 3),
        e.total_bytes,
        e.uploaded_bytes,
        list(e.state or []),
    )


def job_figures(ctx: JobContext, now: float | None = None) -> JobFigures:
    """One job's figures from its catalogs, heartbeats and lease."""
    now = time.time() if now is None else now
    figures = JobFigures(ctx.name, ctx.store.uri)
    for deployment in ctx.deployments.list(ctx.name):
        if deployment.retired_at:
            continue
        status, state = observe_deployment(ctx, deployment)
        age = round(status.age(now), 3) if status else None
        seen = driver_seen(deployment)
        figures.deployments.append(DeploymentFigures(deployment.id, deployment.version, str(state), status, age, seen))
    entries = ctx.store.list(ctx.name)
    for kind in Kind:
        last = _last(entries, kind, now)
        if last is not None:
            figures.last[str(kind)] = last
    failed = [e for e in entries if e.status is SnapshotStatus.FAILED]
    figures.failed = len(failed)
    if failed:
        figures.last_failed_at = max(epoch_of(e.completed_at or e.created_at) for e in failed)
    policy = parse_policy(ctx.spec.retention, f"[jobs.{ctx.name}] retention")
    figures.periods = {str(kind): period for kind in Kind if (period := policy.for_kind(kind).period_s) is not None}
    if ctx.spec.desired is not None:
        _reconciled(ctx, figures, now)
    lease = read_lease(ctx.store.storage, ctx.name)
    if lease is not None:
        held = lease.to_dict()
        figures.lease = {"operation": lease.operation, "holder": lease.holder, "age_s": held["age_s"]}
        figures.lease |= {"ttl_s": lease.ttl_s, "expired": held["expired"]}
    return figures


def _reconciled(ctx: JobContext, figures: JobFigures, now: float) -> None:
    """What the reconcile loop recorded of a declared job, and whether its declared version runs."""
    declared = declared_status(ctx, now)
    assert declared is not None and ctx.spec.desired is not None
    figures.restarts, figures.restarts_left = declared["restarts"], declared["restarts_left"]
    figures.autoscale = declared["autoscale"]
    recommendation = (figures.autoscale or {}).get("recommendation")
    if figures.autoscale is not None and recommendation:  # how old the loop's last look is: an alert needs a fresh one
        figures.autoscale = {**figures.autoscale, "recommendation_age_s": round(now - recommendation["at"], 3)}
    if ctx.spec.desired.state == RUNNING:
        running = [d.version for d in figures.deployments if d.state == State.RUNNING]
        figures.desired_running = ctx.spec.desired.version in running


def observe(context: Context, jobs: Iterable[str] | None = None) -> Figures:
    """Every job's figures (the jobs file's jobs, else every job of the store) and every store's usage. A job
    whose store cannot be read is reported as such (`savepoints_job_up` 0), and the others still are."""
    started = time.monotonic()
    names = sorted(jobs if jobs is not None else context.declared_jobs() or context.store().jobs())

    def one(name: str) -> JobFigures:
        try:
            return job_figures(context.snapshots_of(name))
        except SavepointsError as exc:
            log.warning("metrics of job %s: %s", name, exc)
            return JobFigures(name, _store_uri(context, name), error=str(exc))

    found = map_parallel(one, names, concurrency=JOB_READERS)
    stores = []
    for uri in sorted({f.store for f in found if f.store}):
        try:
            usage = read_usage(SnapshotStore(context.open(uri)))
        except SavepointsError as exc:
            log.warning("metrics of store %s: %s", uri, exc)
            continue
        if usage is not None:
            stores.append(usage)
    return Figures(found, stores, round(time.monotonic() - started, 3))


def _store_uri(context: Context, job: str) -> str:
    try:
        return context.store_uri(job)
    except SavepointsError:
        return ""
