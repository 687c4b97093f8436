"""Retention: prune (the jobs file's policies, flags over them, then garbage collection) and retained
checkpoints of running deployments (`retain`)."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any

from ...core.jobs.context import Context
from ...core.jobs.operation import operation
from ...core.retention.policy import RetentionPolicy, parse_policy
from ...core.retention.prune import prune, retain_checkpoints
from ..options import add_concurrency_option, add_job, add_kafka_option
from ..render import Output, out, plan_table, say

RETAIN = "retain"

_POLICY_KEYS = ("failed_grace", "abandoned_after", "on_cancellation", "retired_retention", "blob_grace", "max_unused")


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    prune_cmd = commands.add_parser(
        "prune", parents=[common], help="apply retention: delete old snapshots and leftovers"
    )
    add_job(
        prune_cmd,
        "only this job's snapshots and deployments (default: every job's; stored contents are store-wide)",
        optional=True,
        was_option=True,
    )
    prune_cmd.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    for kind in ("checkpoint", "savepoint"):
        prune_cmd.add_argument(f"--{kind}-keep-last", type=int, metavar="N", help=f"keep the newest N {kind}s")
        prune_cmd.add_argument(f"--{kind}-max-age", metavar="AGE", help=f"delete {kind}s older than AGE (e.g. 2d)")
    prune_cmd.add_argument("--failed-grace", metavar="AGE", help="keep FAILED snapshots this long (default 1d)")
    prune_cmd.add_argument("--abandoned-after", metavar="AGE", help="IN_PROGRESS this old crashed (default 6h)")
    prune_cmd.add_argument(
        "--on-cancellation", choices=["retain", "delete"], help="retired deployments' live checkpoints"
    )
    prune_cmd.add_argument("--retired-retention", metavar="AGE", help="retain-on-cancellation period (default 7d)")
    prune_cmd.add_argument("--blob-grace", metavar="AGE", help="leave unreferenced contents this long (default 1h)")
    prune_cmd.add_argument(
        "--max-unused", metavar="SHARE", help="repack packs with more unreferenced bytes than this (default 50%%)"
    )
    add_kafka_option(prune_cmd)
    prune_cmd.set_defaults(run=run_prune)

    # `retain` takes retained checkpoints; "checkpoint" names Spark's checkpoint directory and that snapshot kind.
    # `checkpoint`, its name before, still works (with a note), unlisted.
    for name in (RETAIN, "checkpoint"):
        retain_cmd = commands.add_parser(
            name,
            parents=[common],
            description="Take a retained checkpoint (a snapshot of kind checkpoint, deleted by retention) of every "
            "running deployment of JOB whose last committed batch no snapshot holds yet.",
            **({"help": "a retained checkpoint of every running deployment of a job"} if name == RETAIN else {}),
        )
        add_job(retain_cmd, "the job, as the jobs file declares it", was_option=True)
        add_concurrency_option(retain_cmd)
        retain_cmd.set_defaults(run=run_retain)
    retain_cmd.renamed_to = RETAIN


def _policy_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The retention flags as a retention table (same keys and validation as the jobs file)."""
    raw: dict[str, Any] = {}
    for kind in ("checkpoint", "savepoint"):
        limits = {
            key: value
            for key, value in (
                ("keep_last", getattr(args, f"{kind}_keep_last")),
                ("max_age", getattr(args, f"{kind}_max_age")),
            )
            if value is not None
        }
        if limits:
            raw[kind] = limits
    raw.update({key: getattr(args, key) for key in _POLICY_KEYS if getattr(args, key) is not None})
    return raw


def run_prune(args: argparse.Namespace, ctx: Context) -> Output:
    """Defaults <- the job's `retention` in the jobs file (when there is one) <- flags (flags win)."""
    flags = _policy_flags(args)
    default = parse_policy(flags, "retention flags")
    jobs = ctx.declared_jobs()
    per_job: dict[str, RetentionPolicy] = {
        name: parse_policy(
            flags, "retention flags", parse_policy(spec.retention, f"{ctx.jobs_path} [jobs.{name}] retention")
        )
        for name, spec in jobs.items()
    }
    timeout = jobs[args.job].heartbeat_timeout if args.job in jobs else 30.0
    with operation(ctx.snapshots_of(args.job), "prune") if args.job and not args.dry_run else nullcontext():
        plan, result = prune(
            ctx.store(args.job),
            default,
            job=args.job,
            job_policies=per_job,
            dry_run=args.dry_run,
            heartbeat_timeout=timeout,
            open_location=ctx.open,
            kafka=ctx.kafka,
        )
    data = {"dry_run": args.dry_run, "plan": plan.to_dict(), "result": result.to_dict() if result else None}

    def human() -> None:
        out.print(plan_table(plan) if plan.rows() else "nothing to delete or repack")
        for note in plan.notes:
            say(f"note: {note}")
        if result is None:
            say("dry run: nothing was deleted")
        else:
            say(
                f"deleted {result.snapshots} snapshots, {result.checkpoints} retired checkpoint locations "
                f"and {result.blobs} stored objects ({result.deferred_blobs} left for the next run); "
                f"repacked {result.repacked} packs"
            )

    return Output(data, human)


def run_retain(args: argparse.Namespace, ctx: Context) -> Output:
    outcomes = retain_checkpoints(ctx.job(args.job))

    def human() -> None:
        if not outcomes:
            say(f"job {args.job} has no RUNNING deployment: nothing to checkpoint")
        for o in outcomes:
            if o.skipped:
                say(f"deployment {o.deployment}: skipped ({o.skipped})")
            else:
                say(f"deployment {o.deployment}: checkpoint {o.snapshot} at batch {o.batch_id}")

    return Output([o.to_dict() for o in outcomes], human)
