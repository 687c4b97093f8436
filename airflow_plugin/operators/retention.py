"""Retention for one job: retained checkpoints of its running deployments, then prune and garbage
collection by the job's policy from the jobs file."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from airflow.sdk import Context

from ..core.jobs.context import JobContext
from ..core.jobs.operation import operation
from ..core.lease import LeaseHeld
from ..core.retention.policy import parse_policy
from ..core.retention.prune import prune, retain_checkpoints
from .base import SavepointsBaseOperator, flag


class RetentionOperator(SavepointsBaseOperator):
    """`checkpoints`: first snapshot every running deployment as a retained checkpoint (kind checkpoint,
    trigger PERIODIC). Then plan deletions by the job's policy and, unless `dry_run`, carry them out.
    Returns the plan (every deletion with its reason) and what was deleted."""

    template_fields: Sequence[str] = ("job", "dry_run")

    def __init__(self, *, checkpoints: bool = True, dry_run: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoints = checkpoints
        self.dry_run = dry_run

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        job = ctx.spec
        policy = parse_policy(job.retention, f"{self.hook.context.jobs_path} [jobs.{job.name}] retention")
        dry_run = flag(self.dry_run)
        taken = [o.to_dict() for o in retain_checkpoints(ctx)] if self.checkpoints and not dry_run else []
        try:
            with nullcontext() if dry_run else operation(ctx, "prune"):
                plan, result = prune(
                    ctx.store,
                    policy,
                    job=job.name,
                    dry_run=dry_run,
                    heartbeat_timeout=job.heartbeat_timeout,
                    open_location=ctx.open,
                    kafka=lambda name: ctx.kafka if name == job.name else None,
                )
        except LeaseHeld as busy:  # another operation changes the job now: the next scheduled run prunes
            self.log.warning("retention of %s skipped: %s", job.name, busy)
            return {"job": job.name, "checkpoints": taken, "dry_run": dry_run, "skipped": str(busy)}
        self.log.info(
            "retention of %s: %d retained checkpoint(s) taken, %d deletion(s) %s",
            job.name,
            len(taken),
            len(plan.rows()),
            "planned (dry run)" if dry_run else "done",
        )
        for row in plan.rows():
            self.log.info("%s", " | ".join(row))
        return {
            "job": job.name,
            "checkpoints": taken,
            "dry_run": dry_run,
            "plan": plan.to_dict(),
            "result": result.to_dict() if result else None,
        }
