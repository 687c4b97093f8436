"""What the savepoints page shows, as plain data read through the engine: the declared jobs, the fleet at a
glance (every job's state, health, last savepoint), a job's deployments, a page of its snapshots (with the
commands that restore each) and the timeline of all of them. Nothing here knows about HTTP; the FastAPI app
(app.py) turns these dicts into JSON."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from ..core.catalog.snapshots import SnapshotEntry
from ..core.errors import InvalidInput, Refused, SavepointsError
from ..core.guards import source as source_guard
from ..core.jobs.context import Context, JobContext
from ..core.jobs.deploy import refuse_while_live
from ..core.jobs.observe import state_of
from ..core.jobs.overview import overview
from ..core.jobs.savepoint import savepoint_target
from ..core.jobs.spec import JobSpec
from ..core.jobs.stop import job_status
from ..core.parallel import map_parallel
from ..core.reconcile.apply import declared_status
from ..core.reconcile.scaling import rescale_sizes, upgrade_title
from ..core.records.deployment import State
from ..core.records.manifest import Manifest
from ..core.sources.kafka import SourceCheck
from ..core.storage import S3Settings
from ..core.upgrades.record import Upgrades
from ..hooks.savepoints import SavepointsHook

FLEET_READERS = 16  # jobs read at once for the fleet overview
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
RETIRED_SHOWN = 20  # retired deployments the deployments table shows (the newest)
# A person waits for the page: give up on an unreachable store after a few attempts, not botocore's ten
# with exponential backoff (a minute), and show the store's error instead.
PAGE_S3_ATTEMPTS = 2
PAGE_KAFKA_TIMEOUT_S = 3.0  # the same for the Kafka broker whose offsets mark snapshots that cannot be restored


class PageHook(SavepointsHook):
    """The hook the page reads through: the same jobs file and connections as the DAGs, fewer S3 retries."""

    @cached_property
    def s3_settings(self) -> S3Settings | None:
        settings = SavepointsHook.s3_settings.func(self)  # the connection's settings, as the DAGs' tasks get them
        return replace(settings or S3Settings(), max_attempts=PAGE_S3_ATTEMPTS)


@dataclass(frozen=True)
class PageSettings:
    """Where the page reads from. `jobs_file=None`: the jobs file the savepoint DAG reads (dag_params)."""

    jobs_file: str | None = None
    aws_conn_id: str | None = SavepointsHook.default_conn_name

    def resolved_jobs_file(self) -> str:
        if self.jobs_file:
            return self.jobs_file
        from ..dag_params import dag_jobs_file  # imports airflow.sdk: only in the API server, on first use
        from .runs import savepoint_dag_file

        return dag_jobs_file(savepoint_dag_file())

    def hook(self) -> PageHook:
        return PageHook(aws_conn_id=self.aws_conn_id, spark_conn_id=None, jobs_file=self.resolved_jobs_file())


def job_list(hook: SavepointsHook) -> dict[str, Any]:
    jobs = hook.context.jobs
    return {
        "jobs_file": hook.jobs_file,
        "jobs": [
            {
                "name": spec.name,
                "description": spec.description,
                "store": hook.context.store_uri(spec.name),
                "versions": spec.version_names,
                "default_version": spec.default_version,
                "trigger_interval": spec.trigger_interval,
            }
            for spec in sorted(jobs.values(), key=lambda s: s.name)
        ],
    }


def newest_upgrade(job: JobContext) -> dict[str, Any] | None:
    """The job's newest upgrade (its record: mode, phase, why), as the page shows its progress."""
    upgrade = Upgrades(job.store.storage).newest(job.name)
    if upgrade is None:
        return None
    last = upgrade.history[-1] if upgrade.history else {}
    sizes = rescale_sizes(upgrade)
    return {
        "id": upgrade.id,
        "title": upgrade_title(upgrade),  # "rescale 2 -> 4" for the autoscaler's, which keeps the version
        "rescale": {"from_size": sizes[0], "size": sizes[1], "partitions": upgrade.partitions} if sizes else None,
        "to_version": upgrade.to_version,
        "from_version": upgrade.old_version,
        "mode": upgrade.mode,
        "phase": str(upgrade.phase),
        "ended": upgrade.phase.terminal,
        "succeeded": upgrade.phase.succeeded,
        "note": last.get("note", ""),
        "at": last.get("at"),
        "error": upgrade.error,
        "modes": upgrade.modes,
    }


def autoscale_now(job: JobContext) -> dict[str, Any] | None:
    """The job's autoscaler as `savepoints status` shows it (reconcile/apply.py `declared_status`): mode, size,
    min..max, the last recommendation, the last rescale, a held scale-up; None when the job declares none."""
    declared = declared_status(job)
    return declared["autoscale"] if declared else None


def fleet(context: Context, jobs_file: str) -> dict[str, Any]:
    """Every declared job at a glance, the unhealthy ones first (then by name); a job whose store cannot be
    read is a row with the store's error, and the others still show."""

    def row(name: str) -> dict[str, Any]:
        try:
            job = context.job(name)
            return {**overview(job), "declared": declared_status(job), "error": None}
        except SavepointsError as exc:
            return {"job": name, "state": "UNKNOWN", "unhealthy": None, "error": str(exc)}

    rows = map_parallel(row, sorted(context.jobs), concurrency=FLEET_READERS)
    rows.sort(key=lambda r: (not (r["unhealthy"] or r["error"]), r["job"]))
    return {"jobs_file": jobs_file, "jobs": rows, "summary": fleet_summary(rows)}


def fleet_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fleet in a line: "all healthy" only where something runs and all of it is healthy (jobs never deployed
    or stopped are not healthy jobs, they are jobs that do not run); else how many are unhealthy, and that nothing
    runs, and how many are starting or were never deployed."""
    counts = {
        "jobs": len(rows),
        "unhealthy": sum(bool(r["unhealthy"] or r["error"]) for r in rows),
        "running": sum(r["state"] == State.RUNNING for r in rows),
        "starting": sum(r["state"] in (State.STARTING, State.STANDBY) for r in rows),
        "never_deployed": sum(r["state"] == "NONE" for r in rows),
    }
    parts = [f"{counts['unhealthy']} unhealthy"] if counts["unhealthy"] else []
    if not counts["running"]:
        parts.append("nothing runs")
    else:
        parts.append(f"{counts['running']} running" + ("" if counts["unhealthy"] else ", all healthy"))
    if counts["starting"]:
        parts.append(f"{counts['starting']} starting")
    if counts["never_deployed"]:
        parts.append(f"{counts['never_deployed']} never deployed")
    return {**counts, "text": " · ".join(parts)}


def deployments(job: JobContext) -> tuple[list[dict[str, Any]], int]:
    """One row per deployment, newest first (the engine's `savepoints status` rows): every one not retired,
    the newest RETIRED_SHOWN retired ones; and how many older ones were left out."""
    rows, hidden = job_status(job, retired=RETIRED_SHOWN)
    return list(reversed(rows)), hidden


def savepoint_now(job: JobContext) -> dict[str, Any]:
    """Whether a savepoint can be taken now, and if not why: the engine's reason when no deployment is live; one
    that is live but not RUNNING yet (STARTING: its driver has not committed a batch to snapshot) is not one that
    runs either, as the upgrade form says."""
    try:
        target = savepoint_target(job)
    except Refused as exc:
        return {"possible": False, "deployment": None, "reason": str(exc)}
    state = state_of(job, target)
    if state is not State.RUNNING:
        reason = (
            f"job {job.name} has no running deployment: deployment {target.id} is {state}; a savepoint can be taken "
            "once it runs"
        )
        return {"possible": False, "deployment": target.id, "reason": reason}
    return {"possible": True, "deployment": target.id, "reason": ""}


def deploy_now(job: JobContext) -> dict[str, Any]:
    """Whether the job can be deployed now (no deployment of it runs or may still run), and if not the engine's
    reason: the deploy DAG would refuse with it."""
    try:
        refuse_while_live(job, job.deployments.list(job.name))
    except Refused as exc:
        return {"possible": False, "reason": str(exc)}
    return {"possible": True, "reason": ""}


def snapshots_page(
    ctx: JobContext,
    jobs_file: str,
    *,
    offset: int = 0,
    limit: int = PAGE_SIZE,
    focus: str | None = None,
    kind: str | None = None,
    status: str | None = None,
) -> dict[str, Any]:
    """A page of the job's snapshots, newest first. `focus`: the page that holds that snapshot instead of
    `offset` (the extra link opens the page at it). The timeline covers every snapshot, unpaged."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidInput(f"limit {limit} is out of range: use 1 to {MAX_PAGE_SIZE}")
    if offset < 0:
        raise InvalidInput(f"offset {offset} is negative: use 0 or more")
    job = ctx.spec
    manifests = ctx.store.list(job.name)  # oldest first, from the job's catalog
    newest_first = list(reversed(manifests))
    shown = [m for m in newest_first if (not kind or str(m.kind) == kind) and (not status or str(m.status) == status)]
    focus_found = None
    if focus:
        index = next((i for i, m in enumerate(shown) if m.id == focus), None)
        focus_found = index is not None
        if index is not None:
            offset = index - index % limit
    now = utc_now()
    page = shown[offset : offset + limit]
    kafka = ctx.kafka
    checks = source_guard.assess(page, replace(kafka, timeout_s=PAGE_KAFKA_TIMEOUT_S) if kafka else None)
    return {
        "job": job.name,
        "store": ctx.store.uri,
        "total": len(shown),
        "all": len(manifests),
        "offset": offset,
        "limit": limit,
        "focus": focus,
        "focus_found": focus_found,
        "snapshots": [snapshot_row(m, ctx, jobs_file, now, checks.get(m.id)) for m in page],
        "timeline": [
            {
                "id": m.id,
                "kind": str(m.kind),
                "status": str(m.status),
                "batch_id": m.batch_id,
                "created_at": m.created_at,
                "pinned": m.pinned,
                "deployment": m.deployment,  # the page draws each deployment's progress through its snapshots
                # per stateful operator, as the snapshot recorded it (state_stats.py): the page's state chart
                "state": [{k: op.get(k) for k in ("id", "name", "rows", "bytes", "skew")} for op in m.state],
            }
            for m in manifests
        ],
    }


def utc_now() -> datetime:
    return datetime.now(UTC)


def _age_seconds(timestamp: str | None, now: datetime) -> float | None:
    if not timestamp:
        return None
    return round((now - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds(), 1)


def snapshot_row(
    manifest: Manifest | SnapshotEntry,
    ctx: JobContext,
    jobs_file: str | None,
    now: datetime,
    check: SourceCheck | None = None,
) -> dict[str, Any]:
    """A snapshot as the page shows it; `check`: its Kafka positions against the broker (None: no Kafka source)."""
    return {
        **manifest.summary(),
        "job_version": manifest.job_version,
        "age_s": _age_seconds(manifest.created_at, now),
        "commands": restore_commands(ctx.spec, ctx.store.uri, manifest, jobs_file),
        "source_check": check.to_dict() if check else None,
        "history": manifest.history,
    }


def restore_commands(
    job: JobSpec, store: str, manifest: Manifest | SnapshotEntry, jobs_file: str | None
) -> dict[str, str]:
    """The `savepoints` commands that use this snapshot (the CLI's syntax, airflow_plugin/cli), ready to
    paste, most useful first. Only COMPLETED snapshots restore; the others get their inspection command."""
    q = shlex.quote
    snapshot = f"{q(job.name)} {q(manifest.id)} --store {q(store)}"
    commands: dict[str, str] = {}
    if str(manifest.status) == "COMPLETED":
        jobs = f" --jobs {q(jobs_file)}" if jobs_file else ""
        version = manifest.job_version if manifest.job_version in job.versions else job.default_version
        target = f"{job.checkpoint_root.rstrip('/')}/{job.name}/restore-{manifest.id}"
        commands["deploy"] = f"savepoints deploy {q(job.name)}{jobs} --version {q(version)} --restore {q(manifest.id)}"
        commands["restore"] = f"savepoints restore {snapshot} --to {q(target)}"
        commands["verify"] = f"savepoints verify {snapshot}"
    commands["show"] = f"savepoints show {snapshot}"
    return commands
