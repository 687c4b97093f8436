"""The observer: what a deployment really is now, from its heartbeat, its process and its cluster. Called
explicitly where an operation looks at a deployment (a deploy's refusals, a stop, a health gate, an upgrade's
steps, status and the page); the one place that asks YARN, and that writes what it learns (a driver YARN ended)."""

from __future__ import annotations

import logging

from ..errors import ClusterUnavailable, InvalidInput
from ..records.deployment import Deployment, DeploymentStatus, State
from . import yarn
from .context import JobContext
from .deployments import cluster_decides, ended_by_cluster, observed_state
from .launcher import yarn_application

log = logging.getLogger(__name__)


def observe_deployment(ctx: JobContext, deployment: Deployment) -> tuple[DeploymentStatus | None, State]:
    """Its heartbeat, and what the deployment really is now (LOST when the heartbeat is stale or its
    process is gone). A driver in a YARN container that YARN has ended while its heartbeat says it runs is
    recorded FAILED with YARN's diagnostics, once: nobody else will write its last status (so is one whose driver
    wrote only that its JVM went away: YARN's kill signals both at once). One YARN still has queued
    (no container for its driver yet) is STARTING, however long it waits."""
    status = ctx.deployments.status(ctx.name, deployment.id)
    app_id = yarn_application(deployment.launcher)
    if app_id is not None and cluster_decides(status, retired=bool(deployment.retired_at)):
        try:
            report = yarn.application_report(app_id)
        except (ClusterUnavailable, InvalidInput) as exc:  # unreachable, or a Kerberized cluster: the heartbeat
            # alone decides (LOST once it is stale)
            log.warning("deployment %s: %s", deployment.id, exc)
            report = None
        if report is not None and report.ended:
            status = ctx.deployments.status(ctx.name, deployment.id)  # the driver's last word, read after
            if (ended := ended_by_cluster(status, report)) is not None:
                ctx.deployments.write_status(ctx.name, deployment.id, ended)
                status = ended
        if report is not None and report.queued and status is None:  # waits for a container: starting, however
            return status, State.STARTING  # long the queue takes (LOST would have a retry launch a second one)
    return status, observed_state(deployment, status, ctx.spec.heartbeat_timeout)


def state_of(ctx: JobContext, deployment: Deployment) -> State:
    """The deployment's state now (`observe_deployment`)."""
    return observe_deployment(ctx, deployment)[1]
