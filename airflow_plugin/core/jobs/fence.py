"""Fencing: one writer of a job's output across machines, as Kafka's producer epochs, Flink's leader sessions and
Kubernetes' leases do it. A heartbeat that went stale says only that a driver stopped reporting, not that it
stopped: paused (a long GC, SIGSTOP, a partitioned machine) it wakes and commits as if nothing happened.

- Each start of a writer for a job takes the next generation of the job's writers record (records/writers.py) by a
  conditional write, naming the deployments that may commit from then on: the new one, and during a blue/green,
  replay or migration upgrade the old version beside it (`admit`). Every other deployment is left out.
- A driver reads the record on each heartbeat (spark_jobs/runtime/fence.py). While the record names it, its
  fence is valid for `fence_interval` from the moment that read began; its checkpoint file manager checks the
  fence right before every commit file it writes (a batch's offsets and commit, a file sink's log entry), and the
  gated Delta writer before each Delta commit. Left out, it commits nothing more and stops (FAILED, FENCED). Unable
  to read the record for a fence interval, it stops committing by itself, so a frozen driver that wakes finds its
  fence lapsed before its next commit.
- Whoever leaves out a deployment that may still run (one it cannot see end: another machine, another container,
  a LOST heartbeat) waits `fenced_after` from its write before it starts a new writer (`wait_out`): by then the old
  driver's last valid read is more than a fence interval old. Only clock rates matter, not clocks: each side
  measures its own interval on its own monotonic clock.

Pure engine code: no airflow, no pyspark."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from .. import layout
from ..errors import Conflict, IntegrityError, NotFound
from ..process import Liveness
from ..records.deployment import JVM_GONE, Deployment, State
from ..records.writers import Writers, read_writers
from ..storage import Storage
from ..timestamps import utc_now
from .context import JobContext
from .deployments import YARN_ENDED
from .launcher import process_seen

log = logging.getLogger(__name__)

FENCE_SHARE = 0.5  # a driver's fence interval, as a share of the job's heartbeat_timeout
MARGIN_SHARE = 1 / 6  # and the margin a decider adds for clock rates and the check-to-write gap
WRITE_ATTEMPTS = 20
FENCED = "FENCED"  # the error class of a driver left out of the writers record (written by it, or by `kill`)
KILLED = "KILLED"  # the error class `kill` writes for a driver it ended
ENGINE_WRITTEN = frozenset({FENCED, KILLED})  # final statuses another process wrote for a driver


def fence_interval(heartbeat_timeout: float) -> float:
    """How long a driver's fence stays valid after the read that renewed it: shorter than the heartbeat timeout,
    so that a driver that cannot renew stops committing before anyone may read it LOST."""
    return heartbeat_timeout * FENCE_SHARE


def fenced_after(interval: float) -> float:
    """How long after leaving out a driver whose fence interval is `interval` a decider waits before it starts
    another writer: the interval and a margin (with the default shares, two thirds of the heartbeat timeout)."""
    return interval * (FENCE_SHARE + MARGIN_SHARE) / FENCE_SHARE


@dataclass(frozen=True)
class FenceChange:
    record: Writers  # as written
    left_out: list[str]  # deployments the record named before and does not now
    written_at: float  # time.monotonic() once the write was acknowledged
    intervals: dict[str, float]  # the fence interval each one left out was launched with, where recorded


def change_writers(
    storage: Storage,
    job: str,
    decide: Callable[[Writers], dict[str, int]],
    *,
    by: str,
    why: str,
    intervals: dict[str, float] | None = None,
) -> FenceChange:
    """Write the next generation of the job's writers record, `decide` choosing its writers from the current one
    (read again and decided again when another writer won the race); `intervals`: the fence interval of each one
    admitted now."""
    key = layout.writers_key(job)
    for _ in range(WRITE_ATTEMPTS):
        current, token = read_writers(storage, job)
        writers = decide(current)
        left_out = [deployment for deployment in current.writers if deployment not in writers]
        record = current.changed(writers, intervals or {}, left_out, at=utc_now(), by=by, why=why)
        try:
            if token is None:
                storage.create(key, record.to_json())
            else:
                storage.replace(key, record.to_json(), token)
        except Conflict:
            continue
        known = {d: current.intervals[d] for d in left_out if d in current.intervals}
        return FenceChange(record, left_out, time.monotonic(), known)
    raise Conflict(f"the writers record of job {job} in {storage.uri} kept changing while it was written: retry")


def admit(ctx: JobContext, deployment: Deployment, *, beside: Collection[str] = ()) -> FenceChange:
    """Make `deployment` a writer of the job, with the next generation; of the writers so far only those in `beside`
    stay (an upgrade's old version). Returns once every deployment left out that may still run is fenced."""
    kept = set(beside)

    def decide(current: Writers) -> dict[str, int]:
        # one that ran before the job had a record (or was left out meanwhile) is named from now on all the same
        return {**{d: current.writers.get(d, current.generation) for d in kept}, deployment.id: current.generation + 1}

    also = f" beside {', '.join(sorted(kept))}" if kept else ""
    interval = {deployment.id: fence_interval(ctx.spec.heartbeat_timeout)}  # what its launch passes its driver
    why = f"{deployment.id} starts{also}"
    change = change_writers(ctx.store.storage, ctx.name, decide, by=ctx.requested_by, why=why, intervals=interval)
    log.info("job %s: generation %d admits %s", ctx.name, change.record.generation, sorted(change.record.writers))
    wait_out(ctx, change)
    return change


def leave_out(ctx: JobContext, deployment: Deployment, why: str) -> FenceChange:
    """Take `deployment` out of the job's writers (a kill that cannot reach its driver); the others stay."""

    def decide(current: Writers) -> dict[str, int]:
        return {d: g for d, g in current.writers.items() if d != deployment.id}

    return change_writers(ctx.store.storage, ctx.name, decide, by=ctx.requested_by, why=why)


def may_still_commit(ctx: JobContext, deployment: Deployment) -> bool:
    """Whether a deployment's driver may still be running: not seen gone (its process, where this one can look) and
    not ended by its own word (a final status its driver wrote). A final status the engine wrote for it (a kill,
    YARN's report of its application) is no proof: a driver cut off from the cluster's manager may run on; nor is a
    driver's word that its JVM went away (JVM_GONE)."""
    if process_seen(deployment.launcher) is Liveness.GONE:
        return False
    status = ctx.deployments.status(ctx.name, deployment.id)
    if status is None:
        return bool(deployment.launcher)  # never reported: launched, it may be starting somewhere
    # written for it, or its own word that only says its JVM went away (it cannot say what the JVM did after)
    no_proof = status.error_class in (*ENGINE_WRITTEN, JVM_GONE) or str(status.error_class).startswith(YARN_ENDED)
    return status.state.live or status.state is State.LOST or no_proof


def wait_out(ctx: JobContext, change: FenceChange) -> None:
    """Wait until every deployment `change` left out that may still run is fenced (`fenced_after` its fence interval
    from the write)."""
    running = []
    for deployment_id in change.left_out:
        try:
            deployment = ctx.deployments.get(ctx.name, deployment_id)
        except (NotFound, IntegrityError):  # a record gone or unreadable: its driver may run all the same
            running.append(deployment_id)
            continue
        if may_still_commit(ctx, deployment):
            running.append(deployment_id)
    if running:
        wait_fenced(ctx, running, change)


def wait_fenced(ctx: JobContext, deployment_ids: list[str], change: FenceChange) -> None:
    """Sleep until `fenced_after` the longest fence interval of `deployment_ids` (as launched; the job's current one
    where none is recorded, or where it is longer) has passed since `change` was written: a timer, not a condition to
    poll, for what a driver this process cannot see does by its own clock."""
    now_interval = fence_interval(ctx.spec.heartbeat_timeout)
    interval = max([now_interval, *(change.intervals.get(d, now_interval) for d in deployment_ids)])
    remaining = change.written_at + fenced_after(interval) - time.monotonic()
    if remaining <= 0:
        return
    which = ", ".join(deployment_ids)
    ctx.progress.stage(
        f"fencing {which}: it may still run where this process cannot see it (another machine or container, or "
        f"paused); waiting {remaining:.0f} s until it can commit no more"
    )
    log.warning("job %s: waiting %.0f s until %s is fenced", ctx.name, remaining, which)
    time.sleep(remaining)
