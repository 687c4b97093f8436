"""Is a deployment healthy? A pure verdict from what the store shows (the Flink operator's job-status
observation): a fresh heartbeat, K batches committed since it started or was restored, no error; and, if
asked (`lag_must_fall`) for a job that reads Kafka, a Kafka lag that falls: the lag of its last batch is 0
or below the lag of its first batch (both from Spark's progress, reported by the job runtime). A new
version that commits batches but falls further behind never becomes healthy, so the upgrade rolls back.
The health gate of an upgrade and the Airflow sensor/trigger share this one rule."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from ..records.deployment import Deployment, DeploymentStatus, State
from .context import JobContext
from .deployments import observed_state
from .observe import observe_deployment


class Verdict(StrEnum):
    HEALTHY = "HEALTHY"
    WAITING = "WAITING"  # not yet: starting, or fewer than K new batches so far
    UNHEALTHY = "UNHEALTHY"  # failed, stopped, lost: waiting longer will not help


@dataclass(frozen=True)
class Health:
    verdict: Verdict
    reason: str
    job: str
    deployment: str
    version: str
    state: str
    last_batch_id: int | None
    target_batch_id: int
    heartbeat_age_s: float | None
    kafka_lag: int | None = None
    kafka_lag_first: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": str(self.verdict)}


def target_batch(deployment: Deployment, min_batches: int) -> int:
    """The batch id whose commit proves `min_batches` new batches: counted from the restored batch (a
    restored query resumes at N+1), or from -1 for a fresh start."""
    start = deployment.restored_batch_id if deployment.restored_batch_id is not None else -1
    return start + max(1, min_batches)


def assess(
    deployment: Deployment,
    status: DeploymentStatus | None,
    *,
    min_batches: int,
    heartbeat_timeout: float,
    lag_must_fall: bool = False,
    now: float | None = None,
    observed: State | None = None,
) -> Health:
    """`observed`: the state `observe_deployment` saw (what its cluster says too); else read off the heartbeat."""
    now = time.time() if now is None else now
    state = observed or observed_state(deployment, status, heartbeat_timeout, now)
    target = target_batch(deployment, min_batches)
    last = status.last_batch_id if status else None
    age = round(status.age(now), 1) if status else None
    lag, first_lag = (status.kafka_lag, status.kafka_lag_first) if status else (None, None)

    def verdict(v: Verdict, reason: str) -> Health:
        facts = (deployment.job, deployment.id, deployment.version, str(state), last, target, age, lag, first_lag)
        return Health(v, reason, *facts)

    if state is State.FAILED:
        error = "no error recorded"
        if status and status.error_class:
            error = f"{status.error_class}: {status.error_message}"
        return verdict(Verdict.UNHEALTHY, f"deployment {deployment.id} FAILED ({error})")
    if state is State.LOST:
        return verdict(Verdict.UNHEALTHY, f"deployment {deployment.id} is LOST (no heartbeat, or its process is gone)")
    if state in (State.STOPPING, State.STOPPED):
        return verdict(Verdict.UNHEALTHY, f"deployment {deployment.id} is {state}, not running")
    if status is not None and (skipping := status.skipping()):
        return verdict(Verdict.UNHEALTHY, f"deployment {deployment.id} commits batches it does not run: {skipping}")
    if state is State.RUNNING and last is not None and last >= target:
        committed = f"batch {last} committed (needed {target})"
        if lag_must_fall and lag is not None:
            if lag > 0 and (first_lag is None or lag >= first_lag):
                return verdict(
                    Verdict.WAITING,
                    f"deployment {deployment.id}: {committed}, but its Kafka lag {lag} has not fallen below "
                    f"{first_lag} (its first batch's)",
                )
            committed += f", Kafka lag {lag} (first batch {first_lag})"
        return verdict(Verdict.HEALTHY, f"{committed}, heartbeat {age}s old")
    so_far = f"last batch {last}" if last is not None else "no batch yet"
    return verdict(Verdict.WAITING, f"deployment {deployment.id} is {state}, {so_far}, waiting for batch {target}")


def check_health(ctx: JobContext, deployment_id: str, *, min_batches: int, lag_must_fall: bool = False) -> Health:
    """Observe one deployment and assess it."""
    deployment = ctx.deployments.get(ctx.name, deployment_id)
    status, state = observe_deployment(ctx, deployment)  # with what the cluster says: ended, or still queued
    return assess(
        deployment,
        status,
        min_batches=min_batches,
        heartbeat_timeout=ctx.spec.heartbeat_timeout,
        lag_must_fall=lag_must_fall,
        observed=state,
    )
