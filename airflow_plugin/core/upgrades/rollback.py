"""Rollback of a failed upgrade: the old version back from the savepoint the upgrade cut over from.

Observe (the job's live deployments, the savepoint), decide (is the old deployment still running, so
there is nothing to undo? is a failed new deployment still live and must be stopped first?), act (stop or
kill it, then deploy the savepoint's version from the savepoint). A pre-started driver the upgrade left
in STANDBY is stopped in every case. The savepoint is the state at the old
version's last batch, so no event is lost; the batches the new version committed to the sink after it are
rewound (moved aside into the sink's quarantine, sinks/file.py) and the old version writes them again."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from ..errors import Refused, SavepointsError
from ..jobs.context import JobContext
from ..jobs.deploy import DeployRequest, deploy, live_deployments
from ..jobs.operation import operation
from ..jobs.stop import kill, stop
from ..records.deployment import Deployment, State

log = logging.getLogger(__name__)


@dataclass
class RollbackResult:
    action: str  # "none" (the old deployment still runs, or there is no savepoint) or "redeployed"
    reason: str
    deployment: Deployment | None  # what runs now, when known
    replaced: list[str]  # deployments stopped or killed first (standbys included)

    def to_dict(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "action": self.action,
            "reason": self.reason,
            "deployment": d.id if d else None,
            "version": d.version if d else None,
            "restored_from": d.restored_from if d else None,
            "replaced": self.replaced,
        }


def _retire(ctx: JobContext, deployment: Deployment, state: State, timeout: float | None) -> None:
    """Stop a live deployment (a standby ends on a stop request too); kill it if it will not stop, or if
    it is LOST."""
    if state.live:
        try:
            stop(ctx, timeout=timeout, deployment_id=deployment.id)
            return
        except SavepointsError as exc:  # would not stop, failed or got lost while stopping
            log.warning("rollback of %s: %s; force-killing it", ctx.name, exc)
    with contextlib.suppress(Refused):  # already gone
        kill(ctx, deployment.id)


def rollback(
    ctx: JobContext, snapshot_id: str | None, *, stop_timeout: float | None = None, rewind_sink: bool = True
) -> RollbackResult:
    with operation(ctx, "rollback"):
        return _rollback(ctx, snapshot_id, stop_timeout, rewind_sink)


def _rollback(
    ctx: JobContext, snapshot_id: str | None, stop_timeout: float | None, rewind_sink: bool
) -> RollbackResult:
    replaced = []
    for deployment, state in live_deployments(ctx):
        if state is State.STANDBY:
            _retire(ctx, deployment, state, stop_timeout)
            replaced.append(deployment.id)
    if not snapshot_id:
        return RollbackResult(
            "none", "no savepoint to roll back to: the old deployment was not stopped", None, replaced
        )
    savepoint = ctx.store.get(ctx.name, snapshot_id)
    if not savepoint.job_version:
        raise Refused(
            f"snapshot {savepoint.id} of job {ctx.name} does not record the version it was taken from: "
            f"deploy the old version by hand (`savepoints deploy {ctx.name} --version OLD --restore {savepoint.id}`)"
        )
    for deployment, state in live_deployments(ctx):
        if deployment.id == savepoint.deployment and state.live:
            reason = f"deployment {deployment.id} ({deployment.version}) that the savepoint came from still runs"
            log.info("rollback of %s: nothing to do, %s", ctx.name, reason)
            return RollbackResult("none", reason, deployment, replaced)
        log.warning("rollback of %s: replacing %s (%s, %s)", ctx.name, deployment.id, deployment.version, state)
        _retire(ctx, deployment, state, stop_timeout)
        replaced.append(deployment.id)
    restored = deploy(ctx, DeployRequest(savepoint.job_version, restore=savepoint.id, rewind_sink=rewind_sink))
    reason = f"version {savepoint.job_version} redeployed from savepoint {savepoint.id} (batch {savepoint.batch_id})"
    return RollbackResult("redeployed", reason, restored, replaced)
