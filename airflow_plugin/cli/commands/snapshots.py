"""Snapshots of any checkpoint: create, list, show, verify, delete, pin, unpin, restore."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any

from ...core.errors import Refused
from ...core.guards import source as source_guard
from ...core.jobs.context import Context, JobContext
from ...core.jobs.deploy import live_deployments
from ...core.jobs.operation import operation
from ...core.records.manifest import Kind, Trigger, parse_labels
from ...core.sinks import DELTA, FILE, SinkRef
from ...core.sinks import delta as delta_sink
from ...core.snapshots.create import SnapshotRequest, create_snapshot
from ...core.snapshots.lifecycle import delete_snapshot, set_pinned
from ...core.snapshots.restore import execute_restore, plan_restore
from ...core.snapshots.verify import verify_snapshot
from .. import exit_codes
from ..options import add_concurrency_option, add_job, add_kafka_option
from ..render import Output, human_bytes, key_values, out, say, snapshot_table, warn

ACCEPT_GAP_HELP = (
    "restore even if Kafka no longer holds every record after the snapshot (retention deleted them, a topic or "
    "partition is gone); the gap is recorded in the snapshot's history"
)
LABEL_HELP = "a label KEY=VALUE (repeatable), shown by `list` and kept in the manifest"
REWIND_SINK_HELP = (
    "a recorded sink that committed batches after the snapshot is rewound to it instead of refusing (a file sink's "
    "later output is moved into its _savepoints_quarantine/, a Delta table is RESTOREd to the snapshot's version and "
    "the restored query gets a new id; those batches are written again); no query may write it meanwhile"
)


def _one_snapshot(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_job(parser, was_option=True)
    parser.add_argument("id", metavar="ID", help="snapshot id, or 'latest' for the newest COMPLETED one")
    return parser


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    create = commands.add_parser("create", parents=[common], help="snapshot a checkpoint (live or stopped)")
    add_job(create, "the job the snapshot belongs to: any name (a job of the jobs file, or not)", was_option=True)
    create.add_argument(
        "--checkpoint", required=True, help="checkpoint location: path, file://, s3://, s3a:// or hdfs://"
    )
    create.add_argument(
        "--kind",
        choices=[k.value for k in Kind],
        default=Kind.SAVEPOINT.value,
        help="savepoint (default: the user's, kept until deleted) or checkpoint (a retained checkpoint, deleted "
        "by retention)",
    )
    create.add_argument(
        "--trigger",
        choices=[t.value for t in Trigger],
        default=Trigger.MANUAL.value,
        help="what asked for it, recorded in the manifest (default manual)",
    )
    create.add_argument("--label", action="append", default=[], metavar="K=V", help=LABEL_HELP)
    create.add_argument("--pin", action="store_true", help="never delete by retention")
    create.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="LOCATION",
        help="output location of the query's sink, a Delta table or a file sink, whose position to record: a restore "
        "behind it is refused, or rewinds it (repeatable)",
    )
    create.add_argument(
        "--requested-by", default="", metavar="WHO", help="who asked, recorded in the manifest (default $USER)"
    )
    add_concurrency_option(create)
    create.set_defaults(run=run_create)

    listing = commands.add_parser("list", parents=[common], help="list snapshots")
    add_job(listing, "only this job's snapshots (default: every job's)", optional=True, was_option=True)
    add_kafka_option(listing)
    listing.set_defaults(run=run_list)

    show = _one_snapshot(commands.add_parser("show", parents=[common], help="show one snapshot's manifest"))
    add_kafka_option(show)
    show.set_defaults(run=run_show)
    verify = _one_snapshot(commands.add_parser("verify", parents=[common], help="check every stored file's checksum"))
    verify.add_argument("--deep", action="store_true", help="also restore to scratch and read all state with Spark")
    add_concurrency_option(verify)
    verify.set_defaults(run=run_verify)
    delete = _one_snapshot(commands.add_parser("delete", parents=[common], help="delete a snapshot"))
    delete.add_argument("--force", action="store_true", help="delete even if pinned")
    delete.set_defaults(run=run_delete)
    _one_snapshot(commands.add_parser("pin", parents=[common], help="protect from retention")).set_defaults(run=run_pin)
    _one_snapshot(commands.add_parser("unpin", parents=[common], help="remove the protection")).set_defaults(
        run=run_pin
    )
    restore = _one_snapshot(
        commands.add_parser("restore", parents=[common], help="restore into a new checkpoint location")
    )
    restore.add_argument("--to", required=True, metavar="LOCATION", help="an empty or absent location")
    restore.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    restore.add_argument("--rewind-sink", action="store_true", help=REWIND_SINK_HELP)
    restore.add_argument("--accept-source-gap", action="store_true", help=ACCEPT_GAP_HELP)
    add_kafka_option(restore)
    add_concurrency_option(restore)
    restore.set_defaults(run=run_restore)


def run_create(args: argparse.Namespace, ctx: Context) -> Output:
    request = SnapshotRequest(
        job=args.job,
        kind=Kind(args.kind),
        trigger=Trigger(args.trigger),
        requested_by=args.requested_by or ctx.settings.requested_by,
        labels=parse_labels(args.label),
        pinned=args.pin,
        sinks=tuple(SinkRef(DELTA if delta_sink.is_table(ctx.open(loc)) else FILE, loc) for loc in args.sink),
    )
    manifest = create_snapshot(
        ctx.store(args.job),
        ctx.open(args.checkpoint),
        request,
        progress=ctx.settings.progress,
        concurrency=ctx.settings.concurrency,
        open_location=ctx.open,
    )

    def human() -> None:
        say(
            f"snapshot {manifest.id} of job {manifest.job} {manifest.status} at batch {manifest.batch_id}: "
            f"{len(manifest.files)} files, {human_bytes(manifest.total_bytes)}, "
            f"{human_bytes(manifest.uploaded_bytes)} uploaded in {manifest.timings.get('total_s', 0):.1f}s"
        )

    return Output(manifest.summary() | {"timings": manifest.timings}, human)


def run_list(args: argparse.Namespace, ctx: Context) -> Output:
    """Every snapshot, from the catalogs, each checked against a listing of its job's manifests first (what was
    written without its catalog, by hand or from a backup, shows too); those with Kafka sources are checked
    against their job's broker (one query per job)."""
    listing = ctx.store(args.job).validated(args.job)
    snapshots = listing.entries
    checks = {}
    for job in sorted({m.job for m in snapshots}):
        checks |= source_guard.assess([m for m in snapshots if m.job == job], ctx.kafka(job))
    rows = [m.summary() | {"source_check": checks[m.id].to_dict() if m.id in checks else None} for m in snapshots]
    return Output(rows, lambda: out.print(snapshot_table(snapshots, checks) if snapshots else "no snapshots"))


def run_show(args: argparse.Namespace, ctx: Context) -> Output:
    manifest = ctx.store(args.job).get(args.job, args.id)
    check = source_guard.assess([manifest], ctx.kafka(args.job)).get(manifest.id)
    data = manifest.summary() | {
        "source_check": check.to_dict() if check else None,
        "query_id": manifest.query_id,
        "pending_batch_id": manifest.pending_batch_id,
        "watermark_ms": manifest.watermark_ms,
        "source_offsets": manifest.source_offsets,
        "operators": manifest.operators,
        "sinks": manifest.sinks,
        "gate": manifest.gate_note(),
        "spark_conf": manifest.spark_conf,
        "restore_conf": manifest.restore_conf,
        "timings": manifest.timings,
        "attempts": manifest.attempts,
        "verification": manifest.verification,
        "history": manifest.history,
    }
    return Output(data, lambda: out.print(key_values(data)))


def run_verify(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.snapshots_of(args.job)
    report = verify_snapshot(
        job.store,
        args.job,
        args.id,
        deep=args.deep,
        progress=ctx.settings.progress,
        concurrency=ctx.settings.concurrency,
        spark_conf=job.spark_conf(),
    )

    def human() -> None:
        verdict = "OK" if report.ok else "FAILED"
        kind = "deep " if args.deep else ""
        say(
            f"{kind}verify of snapshot {report.snapshot} (batch {report.batch_id}): {verdict}, "
            f"{report.files} files, {human_bytes(report.bytes)} in {report.seconds:.1f}s"
        )
        for problem in report.problems:
            say(f"  - {problem}")
        for op in (report.deep or {}).get("operators", []):
            say(
                f"  operator {op.get('operator')} store {op.get('store')}: {op.get('rows')} rows, "
                f"partitions {op.get('partitions')}, matches original: {op.get('matches_original')}"
            )

    return Output(report.to_dict(), human, exit_codes.OK if report.ok else exit_codes.VERIFY_FAILED)


def run_delete(args: argparse.Namespace, ctx: Context) -> Output:
    result = delete_snapshot(ctx.store(args.job), args.job, args.id, force=args.force)
    return Output(
        result,
        lambda: say(
            f"deleted snapshot {result['snapshot']} of job {args.job} ({result['deleted_blobs']} stored files freed)"
        ),
    )


def run_pin(args: argparse.Namespace, ctx: Context) -> Output:
    manifest = set_pinned(ctx.store(args.job), args.job, args.id, args.command == "pin")
    return Output(manifest.summary(), lambda: say(f"snapshot {manifest.id} {args.command}ned"))


def run_restore(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.snapshots_of(args.job)
    with nullcontext() if args.dry_run else operation(job, "restore"):
        return _restore(args, ctx, job)


def _restore(args: argparse.Namespace, ctx: Context, job: JobContext) -> Output:
    store = job.store
    if args.rewind_sink:  # a managed job's queries may write the sink: none may run
        for deployment, state in live_deployments(job):
            raise Refused(
                f"job {args.job} has deployment {deployment.id} in state {state}, which may write the sink: stop it "
                f"first (`savepoints stop {args.job}`); nothing was written"
            )
    plan = plan_restore(
        store,
        args.job,
        args.id,
        ctx.open(args.to),
        rewind_sink=args.rewind_sink,
        open_location=ctx.open,
        kafka=ctx.kafka(args.job),
        accept_source_gap=args.accept_source_gap,
        spark=job.spark_access(),
    )
    if args.dry_run:
        result = plan.describe()
    else:
        result = execute_restore(store, plan, progress=ctx.settings.progress, concurrency=ctx.settings.concurrency)
    result["dry_run"] = args.dry_run

    def human() -> None:
        verb = "would restore" if args.dry_run else "restored"
        say(
            f"{verb} snapshot {plan.manifest.id} (batch {plan.manifest.batch_id}) into {plan.target.uri}: "
            f"{len(plan.files)} files, {human_bytes(plan.total_bytes)}; the query resumes at batch "
            f"{result['resumes_at_batch']}"
        )
        if plan.sources.check is not None:
            say(f"Kafka offsets: {plan.sources.check.summary()}")
        for path in plan.rewrites:
            say(f"  rewrote absolute paths in {path}")
        for warning in plan.warnings:
            warn(warning)
        if plan.spark_conf:
            say("start the restored query with these Spark confs:")
            for key, value in sorted(plan.spark_conf.items()):
                say(f"  --conf {key}={value}")

    return Output(result, human)
